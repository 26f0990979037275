"""The worker: a real model behind the dynamic batcher, served over HTTP (`tidal worker`).

`batching` (the batching rule in an asyncio shell) with its collaborators `warming`
(buckets warmed) and `windows` (stats windows), `admission` (the queue bound), `memory`,
`runner` (the model on threads), `models` (demo and user models), `app` (HTTP API),
`inference`, `frontend`/`frontends`/`handoff` (front-end processes), `readiness`,
`metrics`, `reporter` (its stats per window), `engine` (the batcher as a pool's engine),
`link` (its membership of a pool on the bus), `defaults`, `cli` and `serve`.
"""
