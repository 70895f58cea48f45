"""What the Batch API's control-plane tests share besides fixtures (a module of its own:
pytest imports every ``conftest`` under one name, so helpers there cannot be imported)."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

from django.test import Client

from apps.tenants.models import Tenant
from apps.tenants.services import tenant_create
from runtime.internal_principal import HEADER, sign

SECRET = "test-internal-secret"
KEY_1 = "k1:" + base64.b64encode(b"1" * 32).decode()
KEY_2 = "k2:" + base64.b64encode(b"2" * 32).decode()
KEYRING = KEY_1  # the at-rest keyring the batch files are sealed with
MODEL = "batch-chat"


def make_tenant(slug: str, *, max_output_tokens: int = 64, zero_retention: bool = False) -> Tenant:
    return tenant_create(
        actor=None, slug=slug, name=slug, rpm_limit=100, tpm_limit=10_000, max_concurrency=4,
        max_context_tokens=2048, max_output_tokens=max_output_tokens,
        zero_retention=zero_retention,
    )  # fmt: skip


def line(custom_id: str, *, model: str = MODEL, url: str = "/v1/chat/completions",
         **body: Any) -> bytes:  # fmt: skip
    request = {"model": model, "messages": [{"role": "user", "content": custom_id}], **body}
    item = {"custom_id": custom_id, "method": "POST", "url": url, "body": request}
    return json.dumps(item).encode()


def jsonl(*lines: bytes) -> bytes:
    return b"\n".join(lines) + b"\n"


class Signed:
    """The Django test client with the router's signed principal for ``tenant``."""

    def __init__(self, tenant: str) -> None:
        self.tenant = tenant
        self.client = Client()

    def headers(self, method: str, path: str) -> dict[str, str]:
        value = sign(SECRET, method=method, path=path, tenant=self.tenant,
                     key_prefix="abcd1234", now=time.time())  # fmt: skip
        return {HEADER: value}

    def get(self, path: str, **query: Any) -> Any:
        return self.client.get(path, query, headers=self.headers("GET", path))

    def delete(self, path: str) -> Any:
        return self.client.delete(path, headers=self.headers("DELETE", path))

    def post_json(self, path: str, data: dict[str, Any]) -> Any:
        return self.client.post(path, json.dumps(data), content_type="application/json",
                                headers=self.headers("POST", path))  # fmt: skip

    def upload(self, content: bytes, purpose: str = "batch") -> Any:
        from django.core.files.uploadedfile import SimpleUploadedFile  # noqa: PLC0415

        path = "/v1/files"
        upload = SimpleUploadedFile("input.jsonl", content, content_type="application/jsonl")
        return self.client.post(path, {"purpose": purpose, "file": upload},
                                headers=self.headers("POST", path))  # fmt: skip
