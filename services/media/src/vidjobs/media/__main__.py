from functools import partial

from vidjobs.common.runtime import run_worker
from vidjobs.media.worker import main
from vidjobs.providers.registry import KEYED_DOWNLOADS, require_api_keys

if __name__ == "__main__":
    # It fetches renders, some of them with the provider's key.
    run_worker("media", main, check=partial(require_api_keys, providers=KEYED_DOWNLOADS))
