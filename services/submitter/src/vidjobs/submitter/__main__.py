from vidjobs.common.runtime import run_worker
from vidjobs.providers.registry import require_api_keys
from vidjobs.submitter.worker import main

if __name__ == "__main__":
    run_worker("submitter", main, check=require_api_keys)  # it calls every offered provider
