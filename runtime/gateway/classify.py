"""POST /v1/classifications: label scores per input from a classification model.

Our own route (OpenAI has none): ``{"model", "input"}`` with ``input`` a string or a list of
strings, answered by the PyTorch worker as ``data[i] = {"index", "label", "scores"}`` plus
``usage``. It goes through the same authentication, planning, admission and scheduling as
``/v1/embeddings`` (a model of task ``classification``) and is coalesced like it.
"""

from __future__ import annotations

from runtime.gateway.inference import InferenceConsumer
from runtime.gateway.schema import EmbeddingRequest, RequestDecoder
from runtime.gateway.unary import CoalescedDispatch


class ClassificationsConsumer(CoalescedDispatch, InferenceConsumer):
    route = "/v1/classifications"
    kind = "classification"
    upstream_path = "/v1/classifications"
    tasks = frozenset({"classification"})
    # The embeddings request's fields (model, input, user); the rest is forwarded as sent.
    decoder = RequestDecoder(EmbeddingRequest)
