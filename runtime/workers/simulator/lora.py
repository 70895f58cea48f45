"""Simulated LoRA adapters: vLLM's runtime loading API with a load cost and ``max_loras``.

With ``--max-loras N`` (0: off, the routes answer 404 as vLLM without ``--enable-lora``) the
simulator serves ``POST /v1/load_lora_adapter`` (``lora_name``, ``lora_path``: the folder must
exist, as vLLM checks; loading takes ``--lora-load-ms``) and ``POST /v1/unload_lora_adapter``;
a request may then name a loaded adapter as its ``model``, and ``/v1/models`` lists each with
``parent`` = the base model, as vLLM does. At most ``--max-cpu-loras`` adapters (default N,
as vLLM) are loaded at once: one more is refused with 400 (the router's LRU evicts first,
:mod:`runtime.workers.adapters`). The per-batch limit N is not modelled (every request runs).
Loads are counted (``loads``) for tests and benches.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path


class LoraError(Exception):
    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


@dataclass
class SimLoras:
    max_loras: int = 0
    resident: int = 0  # adapters kept loaded at once (--max-cpu-loras; at least max_loras)
    load_s: float = 0.0
    loaded: dict[str, str] = field(default_factory=dict)  # name -> path
    loads: int = 0

    async def load(self, name: object, path: object) -> str:
        if self.max_loras <= 0:
            raise LoraError("LoRA is not enabled (--max-loras 0)", 404)
        if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
            raise LoraError("Both 'lora_name' and 'lora_path' must be provided.", 400)
        if name in self.loaded:
            raise LoraError(f"The lora adapter '{name}' has already been loaded.", 400)
        if not await asyncio.to_thread(Path(path).is_dir):
            raise LoraError(f"Loading lora {name} failed: No adapter found for {path}", 404)
        if len(self.loaded) >= max(self.resident, self.max_loras):
            slots = max(self.resident, self.max_loras)
            raise LoraError(f"All {slots} LoRA slots are in use; unload one first.", 400)
        await asyncio.sleep(self.load_s)
        self.loaded[name] = path
        self.loads += 1
        return f"Success: LoRA adapter '{name}' added successfully."

    def unload(self, name: object) -> str:
        if self.max_loras <= 0:
            raise LoraError("LoRA is not enabled (--max-loras 0)", 404)
        if not isinstance(name, str) or name not in self.loaded:
            raise LoraError(f"The lora adapter '{name}' cannot be found.", 404)
        del self.loaded[name]
        return f"Success: LoRA adapter '{name}' removed successfully."
