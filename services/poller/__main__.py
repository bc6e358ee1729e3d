from libs.common.runtime import run_worker
from services.poller.worker import main

if __name__ == "__main__":
    run_worker("poller", main)
