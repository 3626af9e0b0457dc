"""The servers the user runs, reached before any request: up and answering (`connect`), their identity (`probe`),
the model they report held against the configuration's (`held_to_declared`), the model id to request, and what of two
servers' identities must agree for them to be a pair (`comparable`)."""

from __future__ import annotations

import sys
import time

import httpx

from artifact.config import Config
from artifact.engines.endpoint import observe
from artifact.engines.openai_client import (
    OpenAIClient,
    is_loopback,
    one_line,
    split_url,
)
from artifact.errors import ArtifactError
from artifact.provenance import network_interfaces

from artifact.engines.endpoint.settings import Settings, role

CONNECT_S = 3.0  # how long a URL where nothing listens is retried before the one-line error


def connect(client: OpenAIClient, timeout: float, where: str) -> None:
    """Up front, in seconds: a URL where nothing listens (connection refused, no such host) or that does not answer
    fails after CONNECT_S with a one-line error naming it; a server that answers "loading" (HTTP 503, a server the
    user just started) is waited for at most `timeout` seconds (engine.startup_timeout_s)."""
    t0 = time.monotonic()
    said = False
    while True:
        try:
            r = client.http.get("/v1/models", timeout=CONNECT_S)
        except httpx.TimeoutException:
            raise ArtifactError(
                f"{where} does not answer GET /v1/models within {CONNECT_S:.0f} s: is it the "
                "server's URL, and is the server up?"
            ) from None
        except httpx.TransportError as exc:
            if time.monotonic() - t0 > CONNECT_S:
                raise ArtifactError(
                    f"nothing answers at {where} ({type(exc).__name__}: "
                    f"{one_line(exc, 80)}): start the server first, or fix the URL"
                ) from None
            time.sleep(0.3)
            continue
        if r.status_code != 503:
            return
        if time.monotonic() - t0 > timeout:
            raise ArtifactError(
                f"{where} still answers HTTP 503 (loading) after {timeout:.0f} s "
                "(engine.startup_timeout_s, --startup-timeout)"
            )
        if not said:
            print(
                f"{where} is loading (HTTP 503): waiting up to {timeout:.0f} s (engine.startup_timeout_s)",
                file=sys.stderr,
                flush=True,
            )
            said = True
        time.sleep(0.5)


def probe(cfg: Config, s: Settings, url: str) -> dict:
    """The identity of the server at `url` (observe.server_identity), after the network checks."""
    _, host, _ = split_url(url)
    where = f"the server at {url} ({role(s, url)})"
    if not is_loopback(host) and network_interfaces() == ["lo"]:
        raise ArtifactError(
            f"{url} ({role(s, url)}) is not a loopback address and this run is network-isolated: "
            "run it with ARTIFACT_ALLOW_NETWORK=1 (the run is then not isolated, and check says so)"
        )
    client = OpenAIClient(url, cfg.engine.request_timeout_s)
    try:
        connect(client, cfg.engine.startup_timeout_s, where)
        return observe.server_identity(client.get, where)
    finally:
        client.close()


def held_to_declared(cfg: Config, ident: dict, model: str, url: str, where: str) -> dict:
    """What the server reports of its model (observe.reported_model), held against the configuration's [model]: a
    file type that is another quantization, or a parameter count that is not the size the model's name declares, is
    a one-line error before any request. Returns what was held and how (recorded in the pairing inputs)."""
    reported = observe.reported_model(ident, model)
    held = {"reported": reported, "declared": {"name": cfg.model.name, "quant": cfg.model.quant}}
    declared_quant = observe.quant_label(cfg.model.quant)
    got = reported.get("quant")
    if got and declared_quant and got != declared_quant:
        size = f", {reported['n_params'] / 1e6:,.0f}M parameters" if "n_params" in reported else ""
        raise ArtifactError(
            f"{where} reports its model is {reported['ftype']}{size} (/v1/models meta, /props), the "
            f"configuration declares {cfg.model.name!r} {cfg.model.quant}: set [model] name and "
            "quant to what the server serves, or give the URL of the declared model's server"
        )
    held["quant"] = "held: the server's file type" if got else "declared only: the server reports no file type"
    params, n = observe.declared_params(cfg.model.name), reported.get("n_params")
    if params and n:
        if not 0.7 < n / params < 1.4:
            raise ArtifactError(
                f"{where} reports a {n / 1e6:,.0f}M-parameter model (/v1/models meta.n_params), the "
                f"configuration declares {cfg.model.name!r} ({params / 1e6:,.0f}M): set [model] to "
                "what the server serves, or give the URL of the declared model's server"
            )
        held["n_params"] = "held: the server's parameter count against the size the model's name declares"
    else:
        held["n_params"] = "declared only: " + (
            "the server reports no parameter count" if params else "the model's name declares no size (e.g. 8B, 135M)"
        )
    return held


def model_id(s: Settings, ident: dict, url: str) -> str:
    ids = [m.get("id") for m in ident["models"]]
    if s.model:
        if s.model not in ids:
            raise ArtifactError(
                f"the server at {url} does not serve model {s.model!r} (it lists: {', '.join(map(str, ids)) or 'none'})"
            )
        return s.model
    if len(ids) != 1:
        raise ArtifactError(
            f"the server at {url} lists {len(ids)} models ({', '.join(map(str, ids))}): choose one "
            "with engine setting model"
        )
    return str(ids[0])


# what two arms' servers must report alike to be a pair (their addresses, paths and metrics may differ)
SAME = ("models", "version", "build_info", "n_ctx")


def comparable(ident: dict) -> dict:
    props = ident.get("props") or {}
    return {
        "models": ident.get("models"),
        "version": ident.get("version"),
        "build_info": props.get("build_info"),
        "n_ctx": props.get("n_ctx"),
    }
