"""The sanitisation gate: no key, token, password, home folder or private address ships.

It scans what the project adds (the build context and the rendered Dockerfile, before the build;
the image config's environment, labels and history, which holds build arguments, after it) and the
release's text files before they are published. A finding fails the release (exit 3) and names the
file and line with the value masked. ``sanitise.allow`` in product.yaml lists regular expressions
for deliberate values (a documentation example, a public endpoint); a finding whose value matches
one is let through.
"""

from __future__ import annotations

import getpass
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

from .errors import VerificationError

# TOKEN, not TOKENS: MAX_TOKENS and ..._TOKENS_PER_RANK are counts, not secrets
SECRET_KEY_RE = re.compile(r"(PASSWORD|PASSWD|SECRET|TOKEN(?!S)|API_?KEY|PRIVATE_?KEY|CREDENTIALS?)", re.I)
RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("private key", re.compile(r"-----BEGIN (?:[A-Z0-9]+ )?PRIVATE KEY-----")),
    ("AWS access key", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("GitHub token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{40,})\b")),
    ("Hugging Face token", re.compile(r"\bhf_[A-Za-z0-9]{30,}\b")),
    ("OpenAI key", re.compile(r"\bsk-(?:proj-)?[A-Za-z0-9_-]{20,}\b")),
    ("Slack token", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}\b")),
    ("Google API key", re.compile(r"\bAIza[0-9A-Za-z_-]{35}\b")),
    ("JSON web token", re.compile(r"\beyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}")),
    # no backslash in the host: a URL inside escaped JSON (a label) ends at its \"
    ("password in a URL", re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s/:@\"'<>]+:[^\s/@\"'<>]+@[^\s/\"'<>\\]+", re.I)),
    ("home folder", re.compile(r"(?:/home/|/Users/)[A-Za-z0-9._-]+")),
)
PRIVATE_ADDRESS_RE = re.compile(
    r"\b(?:10\.\d{1,3}|172\.(?:1[6-9]|2\d|3[01])|192\.168)\.\d{1,3}\.\d{1,3}\b")


@dataclass(frozen=True, kw_only=True)
class Finding:
    where: str  # file:line, or "image config: env"
    kind: str
    value: str

    @property
    def masked(self) -> str:
        v = self.value
        return v[:4] + "…" + v[-2:] if len(v) > 8 else v[:2] + "…"

    def __str__(self) -> str:
        return f"{self.where}: {self.kind} ({self.masked})"


def builder_identity(env: dict[str, str] | None = None) -> tuple[str, ...]:
    """The builder's home folder and user name (other than root): they must not ship."""
    env = env if env is not None else dict(os.environ)
    home = env.get("HOME") or os.path.expanduser("~")
    user = env.get("USER") or getpass.getuser()
    out = []
    if home and home not in ("/", "/root"):
        out.append(home)
    if user and user != "root" and len(user) >= 3:
        out.append(user)
    return tuple(out)


def scan_text(text: str, where: str, *, addresses: bool = False, identity: tuple[str, ...] = ()) -> list[Finding]:
    findings = []
    for n, line in enumerate(text.splitlines(), 1):
        for kind, rule in RULES:
            for m in rule.finditer(line):
                findings.append(Finding(where=f"{where}:{n}", kind=kind, value=m.group(0)))
        for m in re.finditer(r"/root/[A-Za-z0-9._-][^\s\"']*", line):
            findings.append(Finding(where=f"{where}:{n}", kind="the builder's /root folder", value=m.group(0)))
        for value in identity:
            if re.search(rf"(?<![A-Za-z0-9_]){re.escape(value)}(?![A-Za-z0-9_])", line):
                findings.append(Finding(where=f"{where}:{n}", kind="the builder's home or user name", value=value))
        if addresses:
            for m in PRIVATE_ADDRESS_RE.finditer(line):
                findings.append(Finding(where=f"{where}:{n}", kind="private network address", value=m.group(0)))
    return findings


def scan_env(pairs: Iterable[tuple[str, str]], where: str) -> list[Finding]:
    """Variables whose name says secret and whose value is set (PASSWORD=..., HF_TOKEN=...)."""
    return [Finding(where=f"{where} {key}", kind="secret in the environment", value=value)
            for key, value in pairs if SECRET_KEY_RE.search(key) and value]


def scan_image(env: list[str], labels: dict[str, str], history: list[str], where: str,
               identity: tuple[str, ...] = ()) -> list[Finding]:
    """What an image's config holds: environment, labels and history (where build arguments end up)."""
    pairs = [tuple(e.split("=", 1)) if "=" in e else (e, "") for e in env]
    findings = scan_env(pairs, f"{where}: env")
    for key, value in pairs:
        findings += scan_text(f"{key}={value}", f"{where}: env {key}", identity=identity)
    for key, value in labels.items():
        findings += scan_text(f"{key}={value}", f"{where}: label {key}", identity=identity)
    for i, text in enumerate(history):
        findings += scan_text(text, f"{where}: history[{i}]", identity=identity)
        # build arguments show as "|2 NAME=value NAME=value /bin/sh -c ..."
        args = text.split("/bin/sh -c", 1)[0] if text.startswith("|") else ""
        for match in re.finditer(r"([A-Za-z_][A-Za-z0-9_]*)=(\S+)", args):
            findings += scan_env([(match.group(1), match.group(2))], f"{where}: history[{i}] build argument")
    return findings


def scan_added(engine, image: str, base: str | None, identity: tuple[str, ...]) -> list[Finding]:
    """What an image adds to its base (or all of it, without a base): env, labels, history."""
    info = engine.inspect_image(image)
    history = engine.history(image)
    env, labels = list(info.env), dict(info.labels)
    if base is not None:
        base_info = engine.inspect_image(base)
        if base_info is not None:
            env = [e for e in env if e not in base_info.env]
            labels = {k: v for k, v in labels.items() if base_info.labels.get(k) != v}
            history = history[len(engine.history(base)):]
    return scan_image(env, labels, history, f"image config of {image}", identity)


def allowed(findings: list[Finding], allow: Iterable[str]) -> list[Finding]:
    patterns = [re.compile(p) for p in allow]
    return [f for f in findings if not any(p.search(f.value) for p in patterns)]


def enforce(findings: list[Finding], allow: Iterable[str], what: str) -> None:
    left = allowed(findings, allow)
    if left:
        more = f" (and {len(left) - 1} more)" if len(left) > 1 else ""
        raise VerificationError(f"sanitisation: {left[0]}{more} in {what}; remove it, or allowlist a deliberate "
                                "value in product.yaml under sanitise.allow")


def scan_context(files: Iterable[tuple[str, bytes]], identity: tuple[str, ...]) -> list[Finding]:
    """The build context: every text file (binary files are skipped), by its path in the context."""
    findings = []
    for name, data in files:
        if b"\0" in data[:8192]:
            continue
        findings += scan_text(data.decode("utf-8", "replace"), name, identity=identity)
    return findings


def scan_release_texts(texts: dict[str, str | bytes], identity: tuple[str, ...]) -> list[Finding]:
    """The release's files (notes, manifest, attachments): binary attachments are skipped."""
    findings = []
    for name, text in texts.items():
        if isinstance(text, bytes):
            if b"\0" in text[:8192]:
                continue
            text = text.decode("utf-8", "replace")
        findings += scan_text(text, name, addresses=True, identity=identity)
    return findings


