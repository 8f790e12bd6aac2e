"""Writes the Node.js client's generated part (Clients/js/index.js) and its TypeScript declarations (index.d.ts).

The connection and subscriptions are ordinary source in Clients/js/runtime.js.
"""
import json

from .model import HEADER, Model


def ts_type(schema):
    """The TypeScript type of a JSON schema (component `$ref`s keep their names)."""
    if not schema:
        return "unknown"
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[1]
    if "const" in schema:
        return json.dumps(schema["const"])
    if "enum" in schema:
        return " | ".join(json.dumps(v) for v in schema["enum"])
    if "oneOf" in schema:
        return " | ".join(ts_type(s) for s in schema["oneOf"])
    t = schema.get("type")
    if isinstance(t, list):
        return " | ".join(ts_type({"type": x}) for x in t)
    if t in ("string", "boolean", "null"):
        return t
    if t in ("integer", "number"):
        return "number"
    if t == "array":
        return f"Array<{ts_type(schema.get('items', {}))}>"
    if t == "object":
        props = schema.get("properties")
        if props:
            req = set(schema.get("required", []))
            body = "; ".join(f"{json.dumps(k)}{'' if k in req else '?'}: {ts_type(v)}" for k, v in props.items())
            extra = "; [key: string]: unknown" if schema.get("additionalProperties", True) is not False else ""
            return "{ " + body + extra + " }"
        ap = schema.get("additionalProperties")
        if isinstance(ap, dict):
            return f"Record<string, {ts_type(ap)}>"
        return "Record<string, unknown>"
    return "unknown"


def client(model: Model) -> str:
    out = [f"// BlazeDB client for Node.js ({HEADER}).",
           "import { BlazeError, Connection, Subscription, defaultSocketPath } from './runtime.js';", "",
           "export { BlazeError, Subscription, defaultSocketPath };", "",
           "/** Error codes of the protocol, by name. */",
           "export const ErrorCodes = Object.freeze({" + ", ".join(f"{n}: {e['code']}" for n, e in model.errors.items()) + "});", "",
           "/** A connection to blazed with one method per protocol method; requests may be issued concurrently. */",
           "export class BlazeClient extends Connection {",
           "  constructor(socket) {", "    super(socket);"]
    for area, methods in model.areas().items():
        entries = ", ".join(f"{m.verb}: (params = {{}}) => this.call('{m.name}', params)" for m in methods)
        out.append(f"    this.{area} = Object.freeze({{ {entries} }});")
    out += ["  }", ""]
    for m in model.toplevel():
        out.append(f"  /** {m.summary} */")
        out.append(f"  {m.name}(params = {{}}) {{")
        if m.name == "subscribe":
            out += ["    // The Subscription registers while the response is handled, before any event line after it.",
                    f"    return this._request('{m.name}', params, (result) => new Subscription(this, result));"]
        else:
            out.append(f"    return this.call('{m.name}', params);")
        out += ["  }", ""]
    out[-1:] = ["}", ""]
    return "\n".join(out)


def declarations(model: Model) -> str:
    out = [f"// Type declarations for the BlazeDB Node.js client ({HEADER}).", ""]
    for name, schema in model.doc["components"]["schemas"].items():
        out.append(f"export type {name} = {ts_type(schema)};")
    out.append("")
    groups = list(model.areas().values()) + [model.toplevel()]
    for methods in groups:
        for m in methods:
            t = m.type_name
            fields = "; ".join(f"{json.dumps(p.name)}{'' if p.required else '?'}: {ts_type(p.schema)}" for p in m.params)
            out.append(f"/** Parameters of `{m.name}`: {m.summary} */")
            out.append(f"export interface {t}Params {{ {fields} }}" if fields else f"export type {t}Params = Record<string, never>;")
            out.append(f"/** Result of `{m.name}`. */")
            out.append(f"export type {t}Result = {ts_type(m.result_schema)};")
        out.append("")
    out += ["/** An error response from blazed. */",
            "export declare class BlazeError extends Error {",
            "  readonly code: number;", "  readonly kind: string;", "  readonly data: Record<string, unknown>;", "}",
            "export declare const ErrorCodes: Readonly<{ " + "; ".join(f"{n}: {e['code']}" for n, e in model.errors.items()) + " }>;",
            "export declare function defaultSocketPath(env?: Record<string, string | undefined>): string;", "",
            "/** A connection to blazed. */",
            "export declare class BlazeClient {",
            "  static connect(options?: { socketPath?: string }): Promise<BlazeClient>;",
            "  call(method: string, params?: Record<string, unknown>): Promise<unknown>;",
            "  close(): void;"]
    for m in model.toplevel():
        result = "Subscription" if m.name == "subscribe" else m.type_name + "Result"
        out.append(f"  /** {m.summary} */")
        out.append(f"  {m.name}(params: {m.type_name}Params): Promise<{result}>;")
    for area, methods in model.areas().items():
        entries = "; ".join(f"{m.verb}(params{'' if any(p.required for p in m.params) else '?'}: {m.type_name}Params): Promise<{m.type_name}Result>" for m in methods)
        out.append(f"  readonly {area}: {{ {entries} }};")
    out += ["}", ""]
    if model.toplevel():
        params = model.notifications["subscription"]["params"]["schema"]
        out += ["/** The params of a `subscription` notification. */",
                f"export type SubscriptionNotification = {ts_type(params)};", "",
                "/** A live subscription: an async iterator of events. */",
                "export declare class Subscription implements AsyncIterableIterator<Event> {",
                "  readonly id: string;", "  /** The sequence of the last event read (at first: where the subscription started). */",
                "  readonly seq: number;", "  close(): Promise<void>;", "  next(): Promise<IteratorResult<Event>>;",
                "  return(): Promise<IteratorResult<Event>>;", "  [Symbol.asyncIterator](): Subscription;", "}", ""]
    return "\n".join(out)


def package_json(model: Model) -> str:
    return json.dumps({
        "name": "blazedb", "version": model.version, "description": "Client for blazed, the BlazeDB daemon (" + HEADER + ")",
        "type": "module", "main": "index.js", "types": "index.d.ts",
        "files": ["index.js", "index.d.ts", "runtime.js", "blobs.js", "vectors.js"], "exports": {".": {"types": "./index.d.ts", "default": "./index.js"}, "./blobs": "./blobs.js", "./vectors": "./vectors.js"},
        "engines": {"node": ">=18"}, "scripts": {"test": "node --test test/"}, "dependencies": {}}, indent=2) + "\n"


def outputs(model: Model):
    return {
        "Clients/js/package.json": package_json(model),
        "Clients/js/index.js": client(model),
        "Clients/js/index.d.ts": declarations(model),
    }
