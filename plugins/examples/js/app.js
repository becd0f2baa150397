/**
 * A provider plugin in JavaScript: the test provider's `http://` mode, as an example for plugin
 * authors. The same provider as plugins/examples/python/app.py.
 *
 * Instances live in a small HTTP "instance store" (see host/tests/common/mod.rs), reached through
 * the host's `http` capability. Plugins are stateless: the config arrives as JSON on every call.
 *
 *     GET    {endpoint}/healthz          -> 200 when the store is up            (check)
 *     PUT    {endpoint}/instances/{name} -> 201 created / 200 already there    (create)
 *     GET    {endpoint}/instances/{id}   -> 200 instance / 404                 (get)
 *     DELETE {endpoint}/instances/{id}   -> 204 / 404 (already gone is fine)   (delete)
 *     GET    {endpoint}/instances        -> 200 [instance, ...]                (list)
 *
 * Build with `plugins/examples/js/build.sh` (or `make examples`).
 */

import { log } from "proxy-operator:provider/log@0.1.0";
import { send as httpSend } from "proxy-operator:provider/http@0.1.0";

const NAME = "js-example";
const VERSION = "0.1.0";

const CONFIG_SCHEMA = {
  $schema: "https://json-schema.org/draft/2020-12/schema",
  type: "object",
  required: ["endpoint"],
  additionalProperties: false,
  properties: {
    endpoint: {
      type: "string",
      pattern: "^https?://",
      description: "http(s)://host:port of the instance store",
    },
  },
};

// --- errors ----------------------------------------------------------------------------------
// A provider-error is returned by throwing the variant, `{ tag, val }`; componentize-js turns it
// into the WIT `result`'s error. Anything else thrown (an Error, a bug) is not a valid variant:
// the call traps, and the operator reports it with the engine's message and the JS stack.

class ProviderError {
  constructor(tag, val) {
    this.tag = tag;
    this.val = val;
  }
}

const invalidConfig = (message) => new ProviderError("invalid-config", message);
const permanent = (message) => new ProviderError("permanent", message);
const transient = (message) => new ProviderError("transient", { message, retryAfterMs: undefined });

const utf8 = new TextDecoder("utf-8");

/** Maps an HTTP status that is not a success to a provider error. */
function statusError(status, body) {
  const message = `HTTP ${status}: ${utf8.decode(body.subarray(0, 512))}`;
  if (status === 404) return new ProviderError("not-found", message);
  if (status === 401 || status === 403) return new ProviderError("unauthorized", message);
  if (status === 429) return new ProviderError("quota", message);
  if (status === 408 || (status >= 500 && status <= 599)) return transient(message);
  return permanent(message);
}

/** A refused grant stays `denied`; network trouble is transient; the rest is permanent. */
function httpError(err) {
  switch (err.tag) {
    case "denied":
      return new ProviderError("denied", err.val);
    case "invalid-request":
      return permanent(`invalid request: ${err.val}`);
    case "timeout":
      return transient(`timeout: ${err.val}`);
    case "transport":
      return transient(`transport: ${err.val}`);
    default:
      return permanent(`too large: ${err.val}`);
  }
}

// --- config ----------------------------------------------------------------------------------

/** Parses the config and returns the store's base URL; the error names the field. */
function endpoint(configJson) {
  let config;
  try {
    config = JSON.parse(configJson);
  } catch (e) {
    throw invalidConfig(`config: not valid JSON: ${e.message}`);
  }
  if (config === null || typeof config !== "object" || Array.isArray(config)) {
    throw invalidConfig("config: must be a JSON object");
  }
  for (const key of Object.keys(config)) {
    if (key !== "endpoint") {
      throw invalidConfig(`config.${key}: unknown field \`${key}\`, expected \`endpoint\``);
    }
  }
  if (!("endpoint" in config)) throw invalidConfig("config: missing field `endpoint`");
  const url = config.endpoint;
  if (typeof url !== "string") {
    throw invalidConfig(`config.endpoint: expected a string, got ${JSON.stringify(url)}`);
  }
  if (!url.startsWith("http://") && !url.startsWith("https://")) {
    throw invalidConfig(`config.endpoint: \`${url}\` must start with http:// or https://`);
  }
  return url.replace(/\/+$/, "");
}

// --- the instance store over the host's http capability --------------------------------------

/** An imported function's `result` error is thrown: a ComponentError whose `payload` is the variant. */
function payloadOf(e) {
  return e !== null && typeof e === "object" && "payload" in e ? e.payload : e;
}

function send(method, url, body) {
  const headers = [["accept", "application/json"]];
  let data = new Uint8Array(0);
  if (body !== undefined) {
    headers.push(["content-type", "application/json"]);
    data = new TextEncoder().encode(JSON.stringify(body));
  }
  try {
    return httpSend({ method, url, headers, body: data, timeoutMs: undefined });
  } catch (e) {
    const err = payloadOf(e);
    if (err && typeof err.tag === "string") throw httpError(err);
    throw e;
  }
}

const STATES = ["pending", "provisioning", "running", "stopping", "stopped", "failed", "unknown"];

const optional = (value) => (value === null || value === undefined ? undefined : value);

function field(stored, key, type) {
  const value = stored[key];
  if (typeof value !== type) {
    throw permanent(`instance store answered invalid JSON: missing or wrong field "${key}"`);
  }
  return value;
}

/** Converts an instance as the store keeps it (camelCase JSON) to the WIT record. */
function toInstance(stored) {
  if (stored === null || typeof stored !== "object") {
    throw permanent("instance store answered invalid JSON: expected an instance");
  }
  const owner = optional(stored.owner);
  const createdAt = optional(stored.createdAt);
  return {
    providerId: field(stored, "id", "string"),
    name: field(stored, "name", "string"),
    state: STATES.includes(stored.state) ? stored.state : "unknown",
    address: optional(stored.address),
    port: field(stored, "port", "number"),
    zone: optional(stored.zone),
    // s64 is a BigInt in JavaScript.
    createdAt: createdAt === undefined ? undefined : BigInt(createdAt),
    owner:
      owner === undefined
        ? undefined
        : {
            namespace: field(owner, "namespace", "string"),
            name: field(owner, "name", "string"),
            uid: field(owner, "uid", "string"),
            operatorId: field(owner, "operatorId", "string"),
          },
    message: optional(stored.message),
  };
}

function parse(response) {
  try {
    return JSON.parse(utf8.decode(response.body));
  } catch (e) {
    throw permanent(`instance store answered invalid JSON: ${e.message}`);
  }
}

// --- the exported `provider` interface -------------------------------------------------------

export const provider = {
  describe() {
    return {
      name: NAME,
      version: VERSION,
      description: "Example provider in JavaScript: instances in a loopback HTTP store",
      capabilities: ["log", "http"],
      configSchema: JSON.stringify(CONFIG_SCHEMA),
    };
  },

  validateConfig(config) {
    endpoint(config);
  },

  create(config, spec) {
    const base = endpoint(config);
    let options = null;
    try {
      options = JSON.parse(spec.options);
    } catch {
      options = null;
    }
    log("info", "creating instance", [["name", spec.name]]);
    const body = {
      name: spec.name,
      zone: spec.zone ?? null,
      port: spec.port,
      userDataLen: spec.userData.length,
      owner: {
        namespace: spec.owner.namespace,
        name: spec.owner.name,
        uid: spec.owner.uid,
        operatorId: spec.owner.operatorId,
      },
      options,
    };
    const response = send("PUT", `${base}/instances/${spec.name}`, body);
    if (response.status !== 200 && response.status !== 201) {
      throw statusError(response.status, response.body);
    }
    return toInstance(parse(response));
  },

  get(config, providerId) {
    const response = send("GET", `${endpoint(config)}/instances/${providerId}`);
    if (response.status !== 200) throw statusError(response.status, response.body);
    return toInstance(parse(response));
  },

  delete(config, providerId) {
    const response = send("DELETE", `${endpoint(config)}/instances/${providerId}`);
    if (response.status === 404) {
      log("debug", "instance already gone", [["id", providerId]]);
    } else if (response.status !== 200 && response.status !== 204) {
      throw statusError(response.status, response.body);
    }
  },

  list(config) {
    const response = send("GET", `${endpoint(config)}/instances`);
    if (response.status !== 200) throw statusError(response.status, response.body);
    const stored = parse(response);
    if (!Array.isArray(stored)) {
      throw permanent("instance store answered invalid JSON: expected a list");
    }
    return stored.map(toInstance);
  },

  check(config) {
    const base = endpoint(config);
    let ok, reason, message;
    try {
      const response = send("GET", `${base}/healthz`);
      if (response.status === 200) {
        [ok, reason, message] = [true, "Ok", ""];
      } else {
        [ok, reason, message] = [false, "Unreachable", `HTTP ${response.status}`];
      }
    } catch (e) {
      if (!(e instanceof ProviderError)) throw e;
      if (e.tag === "denied") {
        [ok, reason, message] = [false, "Forbidden", e.val];
      } else {
        // The case's payload: a string, or a transient-error record.
        [ok, reason, message] = [false, "Unreachable", e.val.message ?? e.val];
      }
    }
    return [{ target: "store", ok, reason, message, latencyMs: 0 }];
  },
};
