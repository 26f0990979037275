"""The live bus between a pool's workers and its controllers.

`protocols` names what each role needs of it (a worker, a controller, operator settings,
leadership); `local` implements them in one process (`--redis none`), `redis_bus`
across machines; `wire` is the stats entries' versioned wire format.
"""
