"""A stand-in for LiteLLM's proxy (ghcr.io/berriai/litellm), run inside a test image: it reads the
router's real config file (`--config`, LiteLLM's `model_list`: each `model_name` routed to
`litellm_params.model` at `litellm_params.api_base`) and forwards /v1 requests there, as LiteLLM's
`openai/` provider does: the provider prefix dropped from the upstream model, the deployment's
`api_key` sent as the bearer token. With `general_settings.master_key` set, every /v1 request
must carry it (LiteLLM answers 401 otherwise). Only the standard library and PyYAML."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import yaml


def routes(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["model_name"]: m.get("litellm_params") or {} for m in config.get("model_list") or []}


class Router(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    config: ClassVar[dict[str, Any]] = {}

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write(f"litellm-standin: {format % args}\n")

    def _reply(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _authorized(self) -> bool:
        key = (self.config.get("general_settings") or {}).get("master_key")
        if key and self.headers.get("Authorization") != f"Bearer {key}":
            self._reply(401, json.dumps({"error": {"message": "Authentication Error", "code": "401"}}).encode())
            return False
        return True

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path in ("/health/liveliness", "/health/readiness"):
            self._reply(200, b'"I\'m alive!"')
        elif path in ("/v1/models", "/models"):
            if self._authorized():
                data = [{"id": name, "object": "model", "owned_by": "openai"} for name in routes(self.config)]
                self._reply(200, json.dumps({"object": "list", "data": data}).encode())
        else:
            self._reply(404, b'{"detail": "Not Found"}')

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if not self._authorized():
            return
        request = json.loads(body or b"{}")
        params = routes(self.config).get(request.get("model", ""))
        if params is None:
            self._reply(400, json.dumps({"error": {"message": f"Invalid model name passed in model="
                                                              f"{request.get('model')}"}}).encode())
            return
        request["model"] = str(params["model"]).split("/", 1)[1] if "/" in str(params["model"]) else params["model"]
        path = self.path.split("?", 1)[0].removeprefix("/v1")
        upstream = urllib.request.Request(str(params["api_base"]).rstrip("/") + path, method="POST",
                                          data=json.dumps(request).encode(),
                                          headers={"Content-Type": "application/json",
                                                   "Authorization": f"Bearer {params.get('api_key', '')}"})
        try:
            with urllib.request.urlopen(upstream, timeout=120) as r:
                self._reply(r.status, r.read())
        except urllib.error.HTTPError as e:
            self._reply(e.code, e.read())
        except OSError as e:
            self._reply(502, json.dumps({"error": {"message": f"upstream {params['api_base']}: {e}"}}).encode())


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="litellm")
    p.add_argument("--config", required=True)
    p.add_argument("--port", type=int, default=4000)
    p.add_argument("--host", default="0.0.0.0")
    ns, _ = p.parse_known_args(argv)
    with open(ns.config) as fh:
        Router.config = yaml.safe_load(fh) or {}
    server = ThreadingHTTPServer((ns.host, ns.port), Router)
    # LiteLLM's proxy runs under uvicorn (litellm/proxy/proxy_cli.py, `--run_gunicorn`: "instead of
    # uvicorn"), exec'd as PID 1 (docker/prod_entrypoint.sh, bb3ed9c3), and uvicorn exits on SIGTERM;
    # PID 1 without a handler ignores it, and every `compose stop` would wait its whole timeout.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"litellm stand-in on {ns.host}:{ns.port}, routes {sorted(routes(Router.config))}", flush=True)
    server.serve_forever(poll_interval=0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
