from vidjobs.common.runtime import run_worker
from vidjobs.submitter.worker import main

if __name__ == "__main__":
    run_worker("submitter", main)
