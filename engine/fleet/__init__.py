"""The worker fleet: the broker, the actors, the scheduler, the supervisor and the worker processes (and the demo clinic `lembra up` seeds)."""

import engine.flows.receivers  # noqa: E402,F401  (appointment changes and opt-outs reach the flows)
