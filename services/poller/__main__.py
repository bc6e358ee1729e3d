from vidjobs.common.runtime import run_worker
from vidjobs.poller.worker import main

if __name__ == "__main__":
    run_worker("poller", main)
