from libs.common.runtime import run_worker
from services.reaper.worker import main

if __name__ == "__main__":
    run_worker("reaper", main)
