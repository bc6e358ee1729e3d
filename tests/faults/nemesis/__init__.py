"""The nemesis: a mixed load through the public API while faults picked at random from the whole catalogue
overlap, then a check of the whole history at quiescence. A seed fixes the fault schedule and the load's
choices (`python -m tests.faults nemesis --seed S --minutes M`); the interleavings still depend on timing.

- `schedule.py`: the fault schedule a seed makes: which fault, on what, when, for how long (pure, printable);
- `catalogue.py`: how each kind of fault begins and ends on a running stack;
- `network.py`: a TCP fault proxy in front of every PostgreSQL and NATS address the services are given;
- `load.py`: the load: accounts with webhook endpoints, creates of every scenario, uploads, cancels, deletes,
  reruns, keeps and exports, and the history of what it was told;
- `run.py`: one run: servers, the stack with two of each worker, load and faults together, healing,
  quiescence, the check.
"""
