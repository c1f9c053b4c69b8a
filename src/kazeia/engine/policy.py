"""Gate policies: a small TOML file of routing rules (format in docs/gate_policy.md).

Each rule matches a node by op, weight type, K, N, M range and node-name regex and sends it to a path on its
device (`hmx`: the default path, `hvx`: HMX off for that node), to the CPU (`cpu`), splits the micro-batch so
that M avoids a range (`split`), or splits only that op's M into pieces avoiding the range (`split-op`, rows of a
matmul are independent: graph/rowsplit.py). `PolicyGate` is the scheduler's gate for a policy; `split_sizes` is what the
context asks before it runs a micro-batch. Reading a policy never runs code from it (tomllib, then checks).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field

from kazeia.errors import KazeiaError
from kazeia.graph.rowsplit import split_path
from kazeia.graph.tensor import Tensor, type_name
from kazeia.limits import InputLimitError, TextLimits, at, check_nesting, numbered_lines, read_text, safe_regex
from kazeia.outputs import write_text

FORMAT = 1
POLICY_FILE = TextLimits("gate policy", max_bytes=1 << 20, max_line=16 << 10, max_lines=100_000)
MAX_NESTING = 8  # brackets and braces inside one another (a policy needs 2: [[rule]] and a list)
MAX_RULES = 10_000
MAX_EXTENT = 1 << 40  # K, N and M bounds (ggml's extents are int64; no tensor reaches 2^40)
ACTIONS = ("hmx", "hvx", "cpu", "split", "split-op")
RULE_KEYS = {"name", "op", "type", "k", "n", "m", "node", "action", "why", "evidence", "modeled_s"}
MATMUL_OPS = ("MUL_MAT", "MUL_MAT_ID")

Range = tuple[int, int]


def node_m(node: Tensor) -> int:
    """M of a node as rules see it: src1's rows for a matmul (activation rows), else the node's ne[1]."""
    if node.op in MATMUL_OPS and len(node.src) > 1 and node.src[1] is not None:
        return node.src[1].ne[1]
    return node.ne[1]


def _range(v, key: str, where: str) -> Range | None:
    if v is None:
        return None
    if isinstance(v, bool):
        raise KazeiaError(f"{where}: '{key}' must be an integer or [lo, hi]")
    if isinstance(v, int):
        v = [v, v]
    if isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        if not all(0 <= x <= MAX_EXTENT for x in v):
            raise KazeiaError(f"{where}: '{key}' must lie in 0 .. {MAX_EXTENT}")
        if v[0] > v[1]:
            raise KazeiaError(f"{where}: '{key}' range [{v[0]}, {v[1]}] is empty")
        return (v[0], v[1])
    raise KazeiaError(f"{where}: '{key}' must be an integer or [lo, hi]")


def _fmt_range(r: Range) -> str:
    return str(r[0]) if r[0] == r[1] else f"[{r[0]}, {r[1]}]"


@dataclass
class Rule:
    name: str
    action: str
    op: str | None = None
    type: str | None = None
    k: Range | None = None
    n: Range | None = None
    m: Range | None = None
    node: str | None = None
    why: str = ""
    evidence: list[str] = field(default_factory=list)
    modeled_s: float | None = None

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise KazeiaError(f"rule {self.name!r}: action {self.action!r} is not one of {', '.join(ACTIONS)}")
        if self.action in ("split", "split-op") and (self.m is None or self.m[0] < 2):
            raise KazeiaError(f"rule {self.name!r}: split needs an m range starting at 2 or more")
        self._re = safe_regex(self.node, f"rule {self.name[:40]!r}: node regex") if self.node else None

    def matches(self, node: Tensor, m: int | None = None) -> bool:
        """`m`: judge the node as if its M were m (a scan over micro-batch sizes)."""
        if self.op is not None and node.op != self.op and node.desc() != self.op:
            return False
        w = node.src[0] if node.src else None
        if self.type is not None and (w is None or type_name(w.type).lower() != self.type.lower()):
            return False
        for r, v in ((self.k, 0), (self.n, 1)):
            if r is not None and (w is None or not r[0] <= w.ne[v] <= r[1]):
                return False
        mm = node_m(node) if m is None else m
        if self.m is not None and not self.m[0] <= mm <= self.m[1]:
            return False
        return self._re is None or self._re.search(node.name) is not None

    def to_toml(self) -> str:
        out = ["[[rule]]", f"name = {_q(self.name)}"]
        for key in ("op", "type", "node"):
            v = getattr(self, key)
            if v is not None:
                out.append(f"{key} = {_q(v)}")
        for key in ("k", "n", "m"):
            v = getattr(self, key)
            if v is not None:
                out.append(f"{key} = {_fmt_range(v)}")
        out.append(f"action = {_q(self.action)}")
        if self.why:
            out.append(f"why = {_q(self.why)}")
        if self.evidence:
            out.append("evidence = [\n" + "".join(f"  {_q(e)},\n" for e in self.evidence) + "]")
        if self.modeled_s is not None:
            out.append(f"modeled_s = {self.modeled_s!r}")
        return "\n".join(out) + "\n"


def _q(s: str) -> str:
    """A TOML basic string."""
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


@dataclass
class Policy:
    rules: list[Rule] = field(default_factory=list)
    source: dict = field(default_factory=dict)
    path: str = "<policy>"

    @classmethod
    def load(cls, path: str) -> Policy:
        text = read_text(path, POLICY_FILE)
        for n, line in numbered_lines(text, path, POLICY_FILE):
            if "\ufffd" in line:
                raise InputLimitError(f"{at(path, n)}: not UTF-8 text (a gate policy is TOML)")
        check_nesting(text, path, MAX_NESTING)
        try:
            doc = tomllib.loads(text)
        except (tomllib.TOMLDecodeError, RecursionError) as e:
            raise KazeiaError(f"{path}: not a TOML gate policy: {e}") from None
        return cls.from_dict(doc, path)

    @classmethod
    def from_dict(cls, doc: dict, path: str = "<policy>") -> Policy:
        fmt = doc.get("format")
        if type(fmt) is not int or fmt != FORMAT:  # exactly the integer: true and 1.0 are other TOML types
            raise KazeiaError(f"{path}: 'format = {FORMAT}' is required (got {str(fmt)[:40]!r})")
        extra = set(doc) - {"format", "source", "rule"}
        if extra:
            raise KazeiaError(f"{path}: unknown key(s) {', '.join(sorted(extra))}")
        rules, names = [], set()
        listed = doc.get("rule", [])
        if not isinstance(listed, list):
            raise KazeiaError(f"{path}: 'rule' must be a list of [[rule]] tables")
        if len(listed) > MAX_RULES:
            raise InputLimitError(f"{path}: {len(listed)} rules (at most {MAX_RULES})")
        for i, r in enumerate(listed):
            where = f"{path}: rule {i + 1}"
            if not isinstance(r, dict) or "name" not in r or "action" not in r:
                raise KazeiaError(f"{where}: needs 'name' and 'action'")
            bad = set(r) - RULE_KEYS
            if bad:
                raise KazeiaError(f"{where}: unknown key(s) {', '.join(sorted(bad))}")
            for key in ("name", "action", "op", "type", "node", "why"):
                if key in r and not isinstance(r[key], str):
                    raise KazeiaError(f"{where}: '{key}' must be a string")
            if r["name"] in names:
                raise KazeiaError(f"{where}: duplicate rule name {r['name']!r}")
            names.add(r["name"])
            ev = r.get("evidence", [])
            if not isinstance(ev, list) or not all(isinstance(e, str) for e in ev):
                raise KazeiaError(f"{where}: 'evidence' must be a list of strings")
            ms = r.get("modeled_s")
            if ms is not None and (isinstance(ms, bool) or not isinstance(ms, int | float) or not 0 <= ms < 1e9):
                raise KazeiaError(f"{where}: 'modeled_s' must be a number of seconds")
            rules.append(Rule(r["name"], r["action"], r.get("op"), r.get("type"), _range(r.get("k"), "k", where),
                              _range(r.get("n"), "n", where), _range(r.get("m"), "m", where), r.get("node"),
                              r.get("why", ""), list(ev), None if ms is None else float(ms)))
        src = doc.get("source", {})
        if not isinstance(src, dict):
            raise KazeiaError(f"{path}: [source] must be a table")
        return cls(rules, dict(src), path)

    def to_toml(self) -> str:
        head = [f"# kazeia gate policy (format {FORMAT}; see docs/gate_policy.md)", f"format = {FORMAT}", ""]
        if self.source:
            head.append("[source]")
            for k, v in self.source.items():
                head.append(f"{k} = {_toml_value(v)}")
            head.append("")
        return "\n".join(head) + "\n" + "\n".join(r.to_toml() for r in self.rules)

    def save(self, path: str) -> None:
        write_text(path, self.to_toml())
        self.path = path

    def first_match(self, node: Tensor, m: int | None = None) -> Rule | None:
        for r in self.rules:
            if r.matches(node, m):
                return r
        return None


def _toml_value(v) -> str:
    if isinstance(v, str):
        return _q(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {v!r}")


@dataclass(frozen=True)
class Route:
    """What a gate decided for a node: the backend (None: the device, i.e. the first backend), the path on it
    (None: its default) and the reason shown in the placement table; `rule` names the rule."""

    target: str | None
    path: str | None
    reason: str
    rule: str | None = None


@dataclass
class PolicyGate:
    """The scheduler's gate for a policy: the first matching rule decides (split rules are the context's)."""

    policy: Policy
    cpu: str = "CPU"

    def __call__(self, node: Tensor) -> Route | None:
        r = self.policy.first_match(node)
        if r is None or r.action == "split":
            return None
        reason = f"rule {r.name} ({self.policy.path}): {r.action}"
        if r.action == "cpu":
            return Route(self.cpu, "cpu", reason, r.name)
        if r.action == "split-op":
            return Route(None, split_path(*r.m), reason, r.name)
        return Route(None, "hvx" if r.action == "hvx" else None, reason, r.name)

    def describe(self) -> str:
        return f"gate policy {self.policy.path} ({len(self.policy.rules)} rules)"


def split_sizes(n_tokens: int, nodes_for, policy: Policy, limit: int = 64) -> list[int]:
    """Micro-batch sizes that run `n_tokens` tokens with no node matching a split rule at its M: [n_tokens] when
    none does. `nodes_for(t)` gives the computed nodes of a t-token micro-batch graph."""
    splits = [r for r in policy.rules if r.action == "split"]
    if not splits:
        return [n_tokens]
    out, rest = [], n_tokens
    while rest > 0 and len(out) < limit:
        hit = _split_hit(rest, nodes_for, policy, splits)
        if hit is None:
            out.append(rest)
            return out
        piece = hit.m[0] - 1
        out.append(piece)
        rest -= piece
    raise KazeiaError(f"split rules cannot place a micro-batch of {n_tokens} tokens in {limit} pieces")


def _split_hit(t: int, nodes_for, policy: Policy, splits: list[Rule]) -> Rule | None:
    for node in nodes_for(t):
        r = policy.first_match(node)
        if r is not None and r.action == "split" and node_m(node) == t:
            return r
    return None
