from vidjobs.common.runtime import run_worker
from vidjobs.poller.worker import main
from vidjobs.providers.registry import require_api_keys

if __name__ == "__main__":
    run_worker("poller", main, check=require_api_keys)  # it calls every offered provider
