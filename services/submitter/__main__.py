from libs.common.runtime import run_worker
from services.submitter.worker import main

if __name__ == "__main__":
    run_worker("submitter", main)
