"""vidjobs: the backend that owns the lifecycle of AI video render jobs. Everything installed imports under this
root: vidjobs.common, vidjobs.providers and vidjobs.storage (the libs/ folder), vidjobs.<service> (services/),
vidjobs.cli (cli/) and vidjobs.client (clients/python)."""
