"""A provider plugin in Python: the test provider's `http://` mode, as an example for plugin authors.

Instances live in a small HTTP "instance store" (see host/tests/common/mod.rs), reached through the
host's `http` capability. Plugins are stateless: the config arrives as JSON on every call.

    GET    {endpoint}/healthz          -> 200 when the store is up            (check)
    PUT    {endpoint}/instances/{name} -> 201 created / 200 already there    (create)
    GET    {endpoint}/instances/{id}   -> 200 instance / 404                 (get)
    DELETE {endpoint}/instances/{id}   -> 204 / 404 (already gone is fine)   (delete)
    GET    {endpoint}/instances        -> 200 [instance, ...]                (list)

Build with `plugins/examples/python/build.sh` (or `make examples`).
"""

import json
from typing import List, Optional

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import http, log
from wit_world.imports.types import (
    Capability,
    CheckTarget,
    Instance,
    InstanceSpec,
    InstanceState,
    Owner,
    PluginInfo,
    ProviderError_Denied,
    ProviderError_InvalidConfig,
    ProviderError_NotFound,
    ProviderError_Permanent,
    ProviderError_Quota,
    ProviderError_Transient,
    ProviderError_Unauthorized,
    TransientError,
)

NAME = "python-example"
VERSION = "0.1.0"

CONFIG_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["endpoint"],
    "additionalProperties": False,
    "properties": {
        "endpoint": {
            "type": "string",
            "pattern": "^https?://",
            "description": "http(s)://host:port of the instance store",
        },
    },
}


# --- errors ----------------------------------------------------------------------------------
# A provider-error is returned by raising `Err(<case>)`; componentize-py turns it into the WIT
# `result`'s error. Any other exception traps the call (the operator reports it with the traceback).


def invalid_config(message: str) -> Err:
    return Err(ProviderError_InvalidConfig(message))


def permanent(message: str) -> Err:
    return Err(ProviderError_Permanent(message))


def transient(message: str) -> Err:
    return Err(ProviderError_Transient(TransientError(message, None)))


def status_error(status: int, body: bytes) -> Err:
    """Maps an HTTP status that is not a success to a provider error."""
    message = f"HTTP {status}: {body[:512].decode('utf-8', 'replace')}"
    if status == 404:
        return Err(ProviderError_NotFound(message))
    if status in (401, 403):
        return Err(ProviderError_Unauthorized(message))
    if status == 429:
        return Err(ProviderError_Quota(message))
    if status == 408 or 500 <= status <= 599:
        return transient(message)
    return permanent(message)


def http_error(err: http.HttpError) -> Err:
    """A refused grant stays `denied`; network trouble is transient; the rest is permanent."""
    if isinstance(err, http.HttpError_Denied):
        return Err(ProviderError_Denied(err.value))
    if isinstance(err, http.HttpError_InvalidRequest):
        return permanent(f"invalid request: {err.value}")
    if isinstance(err, http.HttpError_Timeout):
        return transient(f"timeout: {err.value}")
    if isinstance(err, http.HttpError_Transport):
        return transient(f"transport: {err.value}")
    return permanent(f"too large: {err.value}")


# --- config ----------------------------------------------------------------------------------


def endpoint(config_json: str) -> str:
    """Parses the config and returns the store's base URL; the error names the field."""
    try:
        config = json.loads(config_json)
    except ValueError as e:
        raise invalid_config(f"config: not valid JSON: {e}")
    if not isinstance(config, dict):
        raise invalid_config("config: must be a JSON object")
    for key in config:
        if key != "endpoint":
            raise invalid_config(f"config.{key}: unknown field `{key}`, expected `endpoint`")
    if "endpoint" not in config:
        raise invalid_config("config: missing field `endpoint`")
    url = config["endpoint"]
    if not isinstance(url, str):
        raise invalid_config(f"config.endpoint: expected a string, got {json.dumps(url)}")
    if not url.startswith(("http://", "https://")):
        raise invalid_config(f"config.endpoint: `{url}` must start with http:// or https://")
    return url.rstrip("/")


# --- the instance store over the host's http capability --------------------------------------


def send(method: str, url: str, body: Optional[dict] = None) -> http.Response:
    headers = [("accept", "application/json")]
    data = b""
    if body is not None:
        headers.append(("content-type", "application/json"))
        data = json.dumps(body, separators=(",", ":")).encode()
    try:
        return http.send(http.Request(method, url, headers, data, None))
    except Err as e:
        raise http_error(e.value)


STATES = {state.name.lower(): state for state in InstanceState}


def to_instance(stored: dict) -> Instance:
    """Converts an instance as the store keeps it (camelCase JSON) to the WIT record."""
    try:
        owner = stored.get("owner")
        return Instance(
            provider_id=stored["id"],
            name=stored["name"],
            state=STATES.get(stored["state"], InstanceState.UNKNOWN),
            address=stored.get("address"),
            port=stored["port"],
            zone=stored.get("zone"),
            created_at=stored.get("createdAt"),
            owner=Owner(owner["namespace"], owner["name"], owner["uid"], owner["operatorId"])
            if owner
            else None,
            message=stored.get("message"),
        )
    except (KeyError, TypeError, AttributeError) as e:
        raise permanent(f"instance store answered invalid JSON: missing or wrong field {e}")


def parse(response: http.Response):
    try:
        return json.loads(response.body)
    except ValueError as e:
        raise permanent(f"instance store answered invalid JSON: {e}")


# --- the exported `provider` interface -------------------------------------------------------


class Provider(exports.Provider):
    def describe(self) -> PluginInfo:
        return PluginInfo(
            name=NAME,
            version=VERSION,
            description="Example provider in Python: instances in a loopback HTTP store",
            capabilities=[Capability.LOG, Capability.HTTP],
            config_schema=json.dumps(CONFIG_SCHEMA),
        )

    def validate_config(self, config: str) -> None:
        endpoint(config)

    def create(self, config: str, spec: InstanceSpec) -> Instance:
        base = endpoint(config)
        try:
            options = json.loads(spec.options)
        except ValueError:
            options = None
        log.log(log.Level.INFO, "creating instance", [("name", spec.name)])
        body = {
            "name": spec.name,
            "zone": spec.zone,
            "port": spec.port,
            "userDataLen": len(spec.user_data),
            "owner": {
                "namespace": spec.owner.namespace,
                "name": spec.owner.name,
                "uid": spec.owner.uid,
                "operatorId": spec.owner.operator_id,
            },
            "options": options,
        }
        response = send("PUT", f"{base}/instances/{spec.name}", body)
        if response.status not in (200, 201):
            raise status_error(response.status, response.body)
        return to_instance(parse(response))

    def get(self, config: str, provider_id: str) -> Instance:
        response = send("GET", f"{endpoint(config)}/instances/{provider_id}")
        if response.status != 200:
            raise status_error(response.status, response.body)
        return to_instance(parse(response))

    def delete(self, config: str, provider_id: str) -> None:
        response = send("DELETE", f"{endpoint(config)}/instances/{provider_id}")
        if response.status == 404:
            log.log(log.Level.DEBUG, "instance already gone", [("id", provider_id)])
        elif response.status not in (200, 204):
            raise status_error(response.status, response.body)

    def list(self, config: str) -> List[Instance]:
        response = send("GET", f"{endpoint(config)}/instances")
        if response.status != 200:
            raise status_error(response.status, response.body)
        stored = parse(response)
        if not isinstance(stored, list):
            raise permanent("instance store answered invalid JSON: expected a list")
        return [to_instance(s) for s in stored]

    def check(self, config: str) -> List[CheckTarget]:
        base = endpoint(config)
        try:
            response = send("GET", f"{base}/healthz")
            if response.status == 200:
                ok, reason, message = True, "Ok", ""
            else:
                ok, reason, message = False, "Unreachable", f"HTTP {response.status}"
        except Err as e:
            if isinstance(e.value, ProviderError_Denied):
                ok, reason, message = False, "Forbidden", e.value.value
            else:
                detail = e.value.value  # the case's payload: a string, or a TransientError
                ok, reason, message = False, "Unreachable", getattr(detail, "message", detail)
        return [CheckTarget(target="store", ok=ok, reason=reason, message=message, latency_ms=0)]
