from vidjobs.common.runtime import run_worker
from vidjobs.reaper.worker import main

if __name__ == "__main__":
    run_worker("reaper", main)
