"""A python-backend model whose execution time grows with the batch it is given.

Each execution sleeps `base_ms + per_item_ms x items` (the items of every request in the
batch Triton's dynamic batcher formed) and returns its input doubled. A sleep stands in
for a model's compute honestly here: what Tidal steers is how Triton forms batches, and
the cost curve is what a latency model says (linear: base + per item), not a CPU's
arithmetic. A `max_batch_size` above the `max_batch_limit` parameter is refused at load,
as a backend refuses a cap its inputs cannot take.
"""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.base_s = float(params.get("base_ms", "10")) / 1e3
        self.per_item_s = float(params.get("per_item_ms", "1")) / 1e3
        limit = int(params.get("max_batch_limit", "64"))
        cap = int(config.get("max_batch_size", 0))
        if cap > limit:
            raise pb_utils.TritonModelException(
                f"max_batch_size {cap} is above what this model's inputs take ({limit})"
            )

    def execute(self, requests):
        inputs = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        items = sum(x.shape[0] for x in inputs)
        time.sleep(self.base_s + self.per_item_s * items)
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", (x * 2).astype(np.float32))])
            for x in inputs
        ]
