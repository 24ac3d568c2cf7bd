"""The worker fleet: the broker, the actors, the scheduler, the supervisor and the worker processes (and the demo clinic `lembra up` seeds)."""
