"""Writes the Swift side of the protocol: `RPCMethod`, one typed parameter struct per method (with its `Result`) and
one struct per closed component schema, into Sources/BlazeProtocol/Generated/RPCMethods.swift.

The daemon's handlers, `BlazeClient` and `blazectl` share these types. Mapping (see model.py for the kinds):
string → String, integer → Int, number → Double, boolean → Bool, any value → JSONValue, array → [T],
map → [String: T], closed object → a struct, enum → a String enum, nullable or optional → T?. An open object is
`[String: JSONValue]` in parameters and `JSONValue` in results (documents come from the store as JSON values); a
number is an unchecked `JSONValue` in parameters, so integers keep exact 64-bit semantics and the store reports a
non-number with its own error kind (`invalid_patch` for a counter increment), and a Double in results.
Consts are not stored: the JSON form always carries them.
"""
import json

from .model import HEADER, Member, Method, Model, Type, camel_type

KEYWORDS = {
    "associatedtype", "class", "deinit", "enum", "extension", "fileprivate", "func", "import", "init", "inout",
    "internal", "let", "open", "operator", "private", "protocol", "public", "static", "struct", "subscript",
    "typealias", "var", "break", "case", "continue", "default", "defer", "do", "else", "fallthrough", "for", "guard",
    "if", "in", "repeat", "return", "switch", "where", "while", "as", "catch", "false", "is", "nil", "rethrows",
    "super", "self", "Self", "throw", "throws", "true", "try", "Type", "Any",
}
RESERVED_NESTED = {"Result", "Type", "Self", "Protocol"}


def ident(name: str) -> str:
    return f"`{name}`" if name in KEYWORDS else name


def lower_camel(name: str) -> str:
    c = camel_type(name)
    return c[:1].lower() + c[1:]


def nested_name(member: str, element: bool) -> str:
    name = camel_type(member)
    if element and name.endswith("ies"):
        name = name[:-3] + "y"
    elif element and name.endswith("s") and not name.endswith("ss"):
        name = name[:-1]
    return name + "Item" if name in RESERVED_NESTED else name


def doc_comment(text: str, indent: str) -> list:
    text = " ".join(text.split())
    return [f"{indent}/// {text}"] if text else []


class Writer:
    """Turns model types into Swift declarations, collecting the nested types a struct needs."""

    def __init__(self, model: Model):
        self.model = model

    # Types -----------------------------------------------------------------------------------------------

    @staticmethod
    def plain(t: Type, result: bool) -> Type:
        """A nullable whose value is already a JSONValue is just that JSONValue (null included)."""
        if t.kind == "nullable" and (t.item.kind == "json" or (t.item.kind == "object" and result)):
            return Type("json", schema=t.schema)
        return t

    def swift_type(self, t: Type, result: bool, nested: str) -> str:
        t = self.plain(t, result)
        if t.ref and t.kind == "struct":
            return f"RPCSchema.{t.ref}"
        k = t.kind
        if k == "string":
            return "String"
        if k == "integer":
            return "Int"
        if k == "number":
            return "Double" if result else "JSONValue"
        if k == "boolean":
            return "Bool"
        if k == "json":
            return "JSONValue"
        if k == "object":
            return "JSONValue" if result else "[String: JSONValue]"
        if k in ("struct", "enum"):
            return nested
        if k == "array":
            return f"[{self.swift_type(t.item, result, nested)}]"
        if k == "map":
            return f"[String: {self.swift_type(t.item, result, nested)}]"
        if k == "nullable":
            return self.swift_type(t.item, result, nested) + "?"
        raise ValueError(f"no Swift type for {k}")

    def decoder(self, t: Type, result: bool, nested: str) -> str:
        """An expression of type `RPCDecode.Step<T>`."""
        t = self.plain(t, result)
        if t.ref and t.kind == "struct":
            return f"RPCSchema.{t.ref}.init(json:)"
        k = t.kind
        simple = {"string": "RPCDecode.string", "integer": "RPCDecode.int",
                  "number": "RPCDecode.double" if result else "RPCDecode.json", "boolean": "RPCDecode.bool"}
        if k in simple:
            return simple[k]
        if k == "json":
            if t.accepts:
                return "{ v throws(RPCShapeError) in try RPCDecode.oneOf(" + json.dumps(t.accepts) + ", v) }"
            return "RPCDecode.json"
        if k == "object":
            return "RPCDecode.objectValue" if result else "RPCDecode.object"
        if k == "struct":
            return f"{nested}.init(json:)"
        if k == "enum":
            return f"{{ v throws(RPCShapeError) -> {nested} in try RPCDecode.enumeration(v) }}"
        inner = self.decoder(t.item, result, nested)
        swift = self.swift_type(t, result, nested)
        if k == "array":
            return f"{{ v throws(RPCShapeError) -> {swift} in try RPCDecode.array(v, {inner}) }}"
        if k == "map":
            return f"{{ v throws(RPCShapeError) -> {swift} in try RPCDecode.map(v, {inner}) }}"
        if k == "nullable":
            return f"{{ v throws(RPCShapeError) -> {swift} in try RPCDecode.nullable(v, {inner}) }}"
        raise ValueError(k)

    def encoder(self, t: Type, expr: str, result: bool, depth: int = 0) -> str:
        """A JSONValue expression for the Swift value `expr`."""
        t = self.plain(t, result)
        k = t.kind
        if k == "string":
            return f".string({expr})"
        if k == "integer":
            return f".int(Int64({expr}))"
        if k == "number":
            return f".double({expr})" if result else expr
        if k == "boolean":
            return f".bool({expr})"
        if k == "json" or (k == "object" and result):
            return expr
        if k == "object":
            return f".object({expr})"
        if k == "struct":
            return f"{expr}.json"
        if k == "enum":
            return f".string({expr}.rawValue)"
        var = f"x{depth}"
        inner = self.encoder(t.item, var, result, depth + 1)
        if k == "array":
            return f".array({expr})" if inner == var else f".array({expr}.map {{ {var} in {inner} }})"
        if k == "map":
            return f".object({expr})" if inner == var else f".object({expr}.mapValues {{ {var} in {inner} }})"
        if k == "nullable":
            return f"({expr}.map {{ {var} -> JSONValue in {inner} }} ?? .null)"
        raise ValueError(k)

    @staticmethod
    def const_literal(value) -> str:
        if isinstance(value, bool):
            return f".bool({'true' if value else 'false'})"
        if isinstance(value, int):
            return f".int({value})"
        if isinstance(value, str):
            return f".string({json.dumps(value)})"
        raise ValueError(value)

    # Nested declarations ---------------------------------------------------------------------------------

    def nested_type_name(self, m: Member) -> str:
        t = m.type
        element = False
        while t.kind in ("array", "map", "nullable"):
            element = element or t.kind in ("array", "map")
            t = t.item
        if t.kind in ("struct", "enum") and not (t.ref and t.kind == "struct"):
            return nested_name(m.name, element)
        return ""

    def innermost(self, t: Type) -> Type:
        while t.kind in ("array", "map", "nullable"):
            t = t.item
        return t

    def struct(self, name: str, t: Type, indent: str, summary: str, result: bool, protocols: str = "RPCObject") -> list:
        """A closed object: stored members, memberwise init, init(json:), json."""
        out = doc_comment(summary, indent) + [f"{indent}public struct {name}: {protocols} {{"]
        inner = indent + "    "
        stored = [m for m in t.members if m.type.kind != "const"]
        for m in t.members:
            nested = self.nested_type_name(m)
            if not nested:
                continue
            it = self.innermost(m.type)
            if it.kind == "struct":
                out += self.struct(nested, it, inner, m.description or f"One element of `{m.name}`.", result)
            else:
                out += doc_comment(f"The values of `{m.name}`.", inner)
                out += [f"{inner}public enum {nested}: String, Sendable, CaseIterable {{"]
                out += [f"{inner}    case {ident(lower_camel(v))} = {json.dumps(v)}" for v in it.values]
                out += [f"{inner}}}", ""]
        for m in stored:
            out += doc_comment(m.description or f"`{m.name}`.", inner)
            out.append(f"{inner}public var {ident(m.name)}: {self.member_type(m, result)}")
        out.append("")
        out += self.memberwise(stored, inner, result)
        out += [f"{inner}/// Reads the value from JSON.", f"{inner}public init(json: JSONValue) throws(RPCShapeError) {{"]
        if stored:
            out.append(f"{inner}    let o = try RPCDecode.object(json)")
        for m in stored:
            out.append(f"{inner}    self.{ident(m.name)} = {self.member_decode(m, result)}")
        out += [f"{inner}}}", ""]
        out += [f"{inner}/// The value's JSON form.", f"{inner}public var json: JSONValue {{",
                f"{inner}    .object(jsonObject)", f"{inner}}}", ""]
        out += self.json_object(t.members, inner, result, "The members of the JSON form.")
        out += [f"{indent}}}", ""]
        return out

    def member_type(self, m: Member, result: bool) -> str:
        swift = self.swift_type(m.type, result, self.nested_type_name(m))
        if not m.required and not swift.endswith("?"):
            swift += "?"
        return swift

    def member_decode(self, m: Member, result: bool) -> str:
        t = m.type
        nested = self.nested_type_name(m)
        if t.kind == "nullable" and m.required:
            return f"try RPCDecode.member(o, {json.dumps(m.name)}, {self.decoder(t, result, nested)})"
        if t.kind == "nullable":
            t = t.item
        fn = "member" if m.required else "optionalMember"
        return f"try RPCDecode.{fn}(o, {json.dumps(m.name)}, {self.decoder(t, result, nested)})"

    def memberwise(self, stored: list, indent: str, result: bool) -> list:
        if not stored:
            return [f"{indent}/// A value with no members.", f"{indent}public init() {{}}", ""]
        args = []
        for m in stored:
            swift = self.member_type(m, result)
            args.append(f"{ident(m.name)}: {swift}" + (" = nil" if swift.endswith("?") and not m.required else ""))
        out = [f"{indent}/// A value from its members.", f"{indent}public init(" + ", ".join(args) + ") {"]
        out += [f"{indent}    self.{ident(m.name)} = {ident(m.name)}" for m in stored]
        return out + [f"{indent}}}", ""]

    def json_object(self, members: list, indent: str, result: bool, summary: str) -> list:
        out = [f"{indent}/// {summary}", f"{indent}public var jsonObject: [String: JSONValue] {{"]
        if not members:
            return out + [f"{indent}    [:]", f"{indent}}}"]
        out.append(f"{indent}    var o = [String: JSONValue](minimumCapacity: {max(len(members), 1)})")
        for m in members:
            key = json.dumps(m.name)
            if m.type.kind == "const":
                out.append(f"{indent}    o[{key}] = {self.const_literal(m.type.value)}")
            elif m.required:
                out.append(f"{indent}    o[{key}] = {self.encoder(m.type, 'self.' + ident(m.name), result)}")
            else:
                t = m.type.item if m.type.kind == "nullable" else m.type
                out.append(f"{indent}    if let v = self.{ident(m.name)} {{ o[{key}] = {self.encoder(t, 'v', result)} }}")
        return out + [f"{indent}    return o", f"{indent}}}"]

    # Methods ---------------------------------------------------------------------------------------------

    def params_struct(self, m: Method) -> list:
        indent = "    "
        inner = indent + "    "
        name = m.type_name
        out = doc_comment(f"Parameters of `{m.name}`: {m.summary}", indent)
        out.append(f"{indent}public struct {name}: RPCParameters {{")
        out.append(f"{inner}public static let method = RPCMethod.{lower_camel(m.name)}")
        out.append("")
        r = m.result
        if r.kind == "struct" and not r.ref:
            out += self.struct("Result", r, inner, f"The result of `{m.name}`.", True)
            decode, encode = "Result.init(json:)", "result.json"
        else:
            result_type = self.swift_type(r, True, "")
            out += doc_comment(f"The result of `{m.name}`.", inner) + [f"{inner}public typealias Result = {result_type}", ""]
            decode = self.decoder(r, True, "")
            encode = self.encoder(r, "result", True)
        for p in m.params:
            nested = self.nested_type_name(p)
            if nested:
                raise ValueError(f"{m.name}.{p.name}: parameters of nested struct or enum types are not generated")
            out += doc_comment(p.description, inner)
            out.append(f"{inner}public var {ident(p.name)}: {self.param_type(p)}")
        out.append("")
        out += self.memberwise_params(m.params, inner)
        out += [f"{inner}/// Checks a request's params: names, presence and JSON types.",
                f"{inner}public init(validating params: [String: JSONValue]) throws(RPCError) {{",
                f"{inner}    try RPCParam.rejectUnknown(params, accepted: {json.dumps([p.name for p in m.params])}, method: Self.method)"]
        for p in m.params:
            out.append(f"{inner}    self.{ident(p.name)} = {self.param_decode(p)}")
        out += [f"{inner}}}", ""]
        out += self.json_object(m.params, inner, False, "The params as a request carries them.")
        out += ["", f"{inner}/// The JSON form of a result.",
                f"{inner}public static func encode(_ result: Result) -> JSONValue {{", f"{inner}    {encode}", f"{inner}}}", "",
                f"{inner}/// Reads a result a daemon sent.",
                f"{inner}public static func decode(_ result: JSONValue) throws(RPCShapeError) -> Result {{",
                f"{inner}    try RPCDecode.value(result, {decode})", f"{inner}}}"]
        return out + [f"{indent}}}", ""]

    def param_type(self, p: Member) -> str:
        swift = self.swift_type(p.type, False, "")
        return swift if p.required or swift.endswith("?") else swift + "?"

    def param_decode(self, p: Member) -> str:
        key = json.dumps(p.name)
        if p.type.kind == "json" and not p.type.accepts and not p.required:
            return f"RPCParam.optionalValue(params, {key})"
        fn = "required" if p.required else "optional"
        return f"try RPCParam.{fn}(params, {key}, of: Self.method, {self.decoder(p.type, False, '')})"

    def memberwise_params(self, params: list, indent: str) -> list:
        if not params:
            return [f"{indent}/// No parameters.", f"{indent}public init() {{}}", ""]
        ordered = sorted(params, key=lambda p: not p.required)
        args = [f"{ident(p.name)}: {self.param_type(p)}" + ("" if p.required else " = nil") for p in ordered]
        out = [f"{indent}/// Parameters from their values (optional ones default to absent).",
               f"{indent}public init(" + ", ".join(args) + ") {"]
        out += [f"{indent}    self.{ident(p.name)} = {ident(p.name)}" for p in params]
        return out + [f"{indent}}}", ""]

    # File ------------------------------------------------------------------------------------------------

    def method_enum(self) -> list:
        out = ["/// Every method of the protocol, by its wire name.",
               "public enum RPCMethod: String, Sendable, CaseIterable {"]
        for m in self.model.methods:
            out += doc_comment(m.summary, "    ") + [f"    case {lower_camel(m.name)} = {json.dumps(m.name)}"]
        out += ["", "    /// The method's one-line summary.", "    public var summary: String {", "        switch self {"]
        for m in self.model.methods:
            out.append(f"        case .{lower_camel(m.name)}: return {json.dumps(m.summary, ensure_ascii=False)}")
        out += ["        }", "    }", "", "    /// The method's parameter names, in document order.",
                "    public var parameterNames: [String] {", "        switch self {"]
        for m in self.model.methods:
            out.append(f"        case .{lower_camel(m.name)}: return {json.dumps([p.name for p in m.params])}")
        out += ["        }", "    }", "}", ""]
        return out

    def file(self) -> str:
        out = [f"// {HEADER[0].upper() + HEADER[1:]}.", "// swift-format-ignore-file", "",
               *self.method_enum(),
               "/// The typed parameters (and nested `Result`) of each method, named after it: `RPC.DocInsert` is `doc.insert`.",
               "public enum RPC {"]
        for m in self.model.methods:
            out += self.params_struct(m)
        out += ["}", "", "/// The params of each notification the daemon sends, named after it: `RPCNotification.Subscription` is",
                "/// `subscription`.", "public enum RPCNotification {"]
        for name, n in self.model.notifications.items():
            t = self.model.notification_type(name)
            lines = self.struct(camel_type(name), t, "    ", f"The params of `{name}`: {n['summary']}", True,
                                "RPCNotificationParams")
            # The method name the struct answers to: after its opening line.
            lines[2:2] = ["        /// The notification's method name.", f"        public static let method = {json.dumps(name)}", ""]
            out += lines
        out += ["}", "", "/// The closed objects the protocol document declares once and results share.", "public enum RPCSchema {"]
        for name, t in self.model.components.items():
            if t.kind == "struct":
                out += self.struct(name, t, "    ", t.schema.get("description", f"The `{name}` schema."), True)
        out += ["}", ""]
        return "\n".join(out)


def version_file(model: Model) -> str:
    """The product's version, from the protocol document's `info.version` (its one source)."""
    return "\n".join([
        f"// {HEADER[0].upper() + HEADER[1:]}.", "// swift-format-ignore-file", "",
        "/// BlazeDB's version (blazed, blazectl, blaze-relay and both clients): the protocol document's `info.version`.",
        f"public let blazeVersion = {json.dumps(model.version)}", ""])


def outputs(model: Model):
    return {
        "Sources/BlazeProtocol/Generated/RPCMethods.swift": Writer(model).file(),
        "Sources/BlazeProtocol/Generated/Version.swift": version_file(model),
    }
