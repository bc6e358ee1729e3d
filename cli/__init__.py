"""Not a package: cli/ holds distributions, each importing under `vidjobs` from its own src/ folder (the root
pyproject.toml lists them). Imported from the repository root, it would be a second name for the same files."""

raise ImportError("cli/ is a folder of distributions, not a package: import vidjobs.<name> (README)")
