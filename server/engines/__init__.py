"""The engines a pool steers, behind one seam (`protocols.Engine`).

`member` makes any engine a member of a pool on the bus (stats out, configs in,
fail-static); `ray_serve` a Ray Serve replica (joined from inside the deployment),
`triton` a Triton model (steered from beside it). Tidal's own batcher implements the
seam in `server.worker.engine`, so nothing here imports the worker.
"""
