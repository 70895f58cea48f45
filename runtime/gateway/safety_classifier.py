"""Classifier rules' model calls: a registered classification model, through the upstream client.

:class:`UpstreamClassifier` implements :class:`runtime.safety.classify.Classifier`: it picks a
ready endpoint of the model's newest published version in the snapshot in force and POSTs
``{"model", "input"}`` to its ``/v1/classifications`` (the encoder worker's route), within
``timeout_s``. The score is ``1 - p(first label)``: a safety classifier's first label is its
benign class (e.g. ``["safe", "unsafe"]``). No endpoint, an error, a timeout or an answer
without scores raise: the rule's ``fail_open`` decides (:func:`runtime.safety.classify.classify`).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

import msgspec

from runtime.snapshot import EndpointSnap, Snapshot
from runtime.upstream.client import UpstreamClient

PATH = "/v1/classifications"


class ClassifierUnavailableError(RuntimeError):
    """The classifier model has no ready endpoint, or answered nothing usable."""


class _Scored(msgspec.Struct):
    scores: dict[str, float]


class _Answer(msgspec.Struct):
    data: list[_Scored]


class UpstreamClassifier:
    def __init__(
        self, client: UpstreamClient, snapshot: Callable[[], Snapshot | None], *,
        timeout_s: float = 2.0,
    ) -> None:  # fmt: skip
        self._client = client
        self._snapshot = snapshot
        self._timeout_s = timeout_s

    def endpoint(self, model: str) -> EndpointSnap:
        snapshot = self._snapshot()
        found = snapshot.models.get(model) if snapshot is not None else None
        if snapshot is None or found is None or not found.versions:
            raise ClassifierUnavailableError(f"no published model {model!r}")
        newest = found.versions[-1]
        for endpoint in snapshot.endpoints.values():
            if endpoint.version == newest and endpoint.state == "ready":
                return endpoint
        raise ClassifierUnavailableError(f"no ready endpoint of {model!r}")

    async def score(self, model: str, text: str) -> float:
        endpoint = self.endpoint(model)
        deadline = asyncio.get_running_loop().time() + self._timeout_s
        body = msgspec.json.encode({"model": model, "input": text})
        response = await self._client.open_stream(
            endpoint, PATH, body, deadline=deadline, first_byte_cap=math.inf
        )
        try:
            answer = msgspec.json.decode(await response.read_json(), type=_Answer)
        except msgspec.DecodeError as exc:
            raise ClassifierUnavailableError(f"{model!r} answered no scores") from exc
        finally:
            await response.aclose()
        if not answer.data or not answer.data[0].scores:
            raise ClassifierUnavailableError(f"{model!r} answered no scores")
        scores = answer.data[0].scores
        return 1.0 - next(iter(scores.values()))
