from vidjobs.common.runtime import run_worker
from vidjobs.media.worker import main

if __name__ == "__main__":
    run_worker("media", main)
