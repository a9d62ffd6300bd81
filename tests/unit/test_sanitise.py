"""The sanitisation gate: what it finds, how it reports it, and what the allowlist lets through."""

from __future__ import annotations

import re

import pytest

from unibake.sanitise import (builder_identity, enforce, scan_env, scan_file, scan_image, scan_release_texts, scan_text,
                              scan_values)
from unibake.errors import InputError, VerificationError

SECRETS = {
    "private key": "-----BEGIN OPENSSH PRIVATE KEY-----",
    "AWS access key": "AKIAIOSFODNN7EXAMPLQ",
    "GitHub token": "ghp_" + "a1B2c3D4e5" * 4,
    "Hugging Face token": "hf_" + "AbCdEfGhIj" * 4,
    "OpenAI key": "sk-proj-" + "Zx9" * 10,
    "Slack token": "xoxb-123456789012-abcdefghij",
    "Google API key": "AIza" + "S" * 35,
    "JSON web token": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.c2lnbmF0dXJlc2lnbmF0dXJl",
    "password in a URL": "https://deploy:hunter2@pypi.example.com/simple",
    "home folder": "/home/alice",
    # found by review: none of these was found (an .npmrc, a .pypirc, a .netrc, a docker config in an engine folder)
    "GitLab token": "glpat-" + "aB3dE" * 4,
    "Docker Hub token": "dckr_pat_" + "aB3dE" * 5,
    "npm token": "npm_" + "aB3dEfGh1J" * 3 + "aB3dEf",
    "PyPI token": "pypi-AgEIcHlwaS5vcmc" + "aB3dE" * 10,
    "Slack webhook": "https://hooks.slack.com/services/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",
    "credentials in an Authorization header": "Authorization: Bearer aB3dEaB3dEaB3dEaB3dE",
    "registry credentials (a docker config's auth)": '"auth": "ZGVwbG95Omh1bnRlcjI="',
    "password in a netrc": "machine pypi.example.com login deploy password hunter2",
}


@pytest.mark.parametrize("kind", sorted(SECRETS))
def test_each_kind_of_secret_is_found_and_masked(kind):
    value = SECRETS[kind]
    findings = scan_text(f"line one\nsetting = {value} # here\n", "engine/config.py")
    assert [f.kind for f in findings] == [kind]
    report = str(findings[0])
    assert report.startswith(f"engine/config.py:2: {kind} (")
    assert value not in report  # never printed whole


def test_the_builders_root_folder_user_and_home_are_found():
    identity = builder_identity({"HOME": "/home/alice", "USER": "alice"}, account_home="/home/alice")
    assert identity == ("/home/alice", "alice")
    # a CI job's HOME and the account's own home are both the builder's
    assert builder_identity({"HOME": "/srv/ci/", "USER": "ci"}, account_home="/var/lib/ci") == \
        ("/srv/ci", "/var/lib/ci")
    assert builder_identity({"HOME": "/srv/ci", "USER": "ci"}, account_home="/bin") == ("/srv/ci",)  # sync's
    assert {f.kind for f in scan_text("cache: /root/.cache/huggingface\n", "x")} == {"the builder's /root folder"}
    found = scan_text("built by alice in /srv\n", "x", identity=identity)
    assert [f.kind for f in found] == ["the builder's home or user name"]
    assert builder_identity({"HOME": "/root", "USER": "root"}, account_home="/root") == ()


def test_secret_variables_are_found_by_name_only_when_set():
    findings = scan_env([("HF_TOKEN", "abc"), ("DB_PASSWORD", "x"), ("API_KEY", ""), ("NCCL_ALGO", "Ring"),
                         ("SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK", "128"), ("TOKEN_FILE", "t")], "env")
    assert [f.where for f in findings] == ["env HF_TOKEN", "env DB_PASSWORD", "env TOKEN_FILE"]  # counts of tokens are no secret


def test_where_a_secret_is_mounted_is_no_secret_by_name():
    # found by an adopter's review: HF_TOKEN_PATH=/run/secrets/hf_token (a real Hugging Face variable), the run-time
    # mount the gate's own message asks for, was refused as "secret in the environment"
    findings = scan_env([("HF_TOKEN_PATH", "/run/secrets/hf_token"), ("DB_PASSWORD_FILE", "/run/secrets/db"),
                         ("OPENAI_API_KEY_FILE", " /secrets/openai.key "), ("TOKEN_FILE", "t"),
                         ("DB_PASSWORD_FILE", "hunter2"), ("DB_PASSWORD", "/x/y"), ("API_KEY_PATH", "/a b")], "env")
    assert [f.where for f in findings] == ["env TOKEN_FILE", "env DB_PASSWORD_FILE", "env DB_PASSWORD",
                                           "env API_KEY_PATH"]


def test_tokenizer_settings_are_no_secret_by_name():
    # TOKENIZERS_PARALLELISM=false is in nearly every Hugging Face stack's env: it failed the release
    findings = scan_env([("TOKENIZERS_PARALLELISM", "false"), ("TOKENIZER_MODE", "auto"),
                         ("SGLANG_TOKENIZER_WORKERS", "4"), ("TOKENISER", "x"), ("HF_TOKEN", "abc"),
                         ("TOKEN_IZ", "t")], "env")
    assert [f.where for f in findings] == ["env HF_TOKEN", "env TOKEN_IZ"]


def test_a_short_finding_says_the_allow_pattern_is_for_what_was_found_not_the_whole_value():
    # MOONCAKE_MASTER=10.0.0.5:50051: the finding is 10.0.0.5; --allow '^10\.0\.0\.5:50051$' never matched it
    findings = scan_values([("tp1.yaml:5: env.MOONCAKE_MASTER", "MOONCAKE_MASTER", "10.0.0.5:50051")])
    assert [f.value for f in findings] == ["10.0.0.5"]
    with pytest.raises(VerificationError, match=r"\(e\.g\. a regular expression for the 8 characters found, not the "
                                                r"whole value\) or with --allow$"):
        enforce(findings, [r"^10\.0\.0\.5:50051$"], "the profiles")
    enforce(findings, [r"^10\.0\.0\.5$"], "the profiles")


def test_a_short_secret_shows_two_of_its_characters_not_six():
    # (before: DB_PASSWORD: Tr0ub4dr! was shown as Tr0u…r!, 6 of its 9 characters, on stderr and in CI logs,
    # and the allow hint repeated them)
    findings = scan_values([("product.yaml:9: env.DB_PASSWORD", "DB_PASSWORD", "Tr0ub4dr!")])
    assert [str(f) for f in findings] == ["product.yaml:9: env.DB_PASSWORD: secret in the environment (Tr…, 9 characters)"]
    with pytest.raises(VerificationError) as caught:
        enforce(findings, [], "the profiles")
    assert "0ub4dr" not in str(caught.value) and "r!" not in str(caught.value)
    assert "a regular expression for the 9 characters found" in str(caught.value)


def test_build_arguments_in_history_are_found():
    history = ["|2 HF_TOKEN=abc123 MODE=fast /bin/sh -c make", "/bin/sh -c #(nop) COPY dir:abc in /opt"]
    findings = scan_image([], {}, history, "image config")
    assert [(f.where, f.kind) for f in findings] == [("image config: history[0] build argument HF_TOKEN",
                                                       "secret in the environment")]


def test_private_addresses_count_in_release_texts_only():
    text = "engine at tcp://10.1.2.3:2375 and 192.168.0.7; public 8.8.8.8; loopback 127.0.0.1\n"
    assert scan_text(text, "x") == []
    found = scan_release_texts({"RELEASE_NOTES.md": text}, ())
    assert [f.value for f in found] == ["10.1.2.3", "192.168.0.7"]


def test_a_finding_fails_with_one_line_and_the_allowlist_lets_deliberate_values_through():
    findings = scan_text(f"token: {SECRETS['Hugging Face token']}\n", "images/tune/tp1/x.json")
    with pytest.raises(VerificationError, match=r"^sanitisation: images/tune/tp1/x\.json:1: Hugging Face token "
                                                r"\(hf_A…Ij, 43 characters\) in the build context; remove it, or "
                                                r"if it is deliberate, allow it in product\.yaml under sanitise\.allow "
                                                r"\(e\.g\. '\^hf_A\.\*Ij\$'\) or with --allow"):
        enforce(findings, (), "the build context")
    enforce(findings, (r"^hf_AbCd",), "the build context")


def test_a_secret_in_an_input_stops_the_run_before_anything_is_written(cli, busybox_product):
    cache = busybox_product.parent / "images/tune/tp1/cache-1.json"
    cache.write_text('{"hub_token": "%s"}\n' % SECRETS["Hugging Face token"])
    assert cli("lock", "--config", str(busybox_product)).code == 0
    result = cli("--config", str(busybox_product))
    assert result.code == 3
    # named by its repository path, not by its copy in the build context
    assert result.error_lines == ["error: sanitisation: images/tune/tp1/cache-1.json:1: Hugging Face token "
                                  "(hf_A…Ij, 43 characters) in the build context; remove it, or if it is deliberate, "
                                  "allow it in product.yaml under sanitise.allow (e.g. '^hf_A.*Ij$') or with --allow"]
    assert not (busybox_product.parent / "dockerfiles").exists()
    assert not (busybox_product.parent / "release").exists()


def test_a_secret_in_a_yaml_env_value_is_caught_at_plan_time_naming_the_key(cli, busybox_product):
    product = busybox_product / "product.yaml"
    product.write_text(product.read_text().replace('env: {SHARED_SETTING: "on"}',
                                                   'env: {SHARED_SETTING: "on", MIRROR: "https://u:p4ss@mirror.example"}'))
    result = cli("--config", str(busybox_product))
    assert result.code == 3 and "password in a URL" in result.error_lines[0]
    assert f"{product}:11: env.MIRROR: password in a URL" in result.error_lines[0]
    assert not (busybox_product.parent / "dockerfiles").exists()  # before anything was rendered


@pytest.mark.parametrize("where, said", [
    ("engine.command", "product.yaml:10: engine.command[2]"),
    ("launch.mounts", "product.yaml:12: launch.mounts.target"),
    ("smoke.prompt", "tp1.yaml:5: smoke.prompt"),
    ("smoke.prompts", "tp1.yaml:5: smoke.prompts[0].prompt"),
    ("build.run", "product.yaml:16: kernels[0].build.run"),
    ("product smoke", "product.yaml:13: smoke.prompt"),  # shared by both profiles: one finding
])
def test_a_secret_in_the_command_the_mounts_or_a_smoke_prompt_is_named_by_its_yaml_key(cli, busybox_product, where,
                                                                                      said):
    # found by probing: caught only in the rendered files, named "Dockerfile:38" or "ctx/meta/entrypoint.sh:20",
    # files the user never wrote and that are not on disk after the failed render
    token = "hf_aB3dEaB3dEaB3dEaB3dEaB3dEaB3dEaB3dE"
    product, tp1 = busybox_product / "product.yaml", busybox_product / "tp1.yaml"
    if where == "engine.command":
        product.write_text(product.read_text().replace("/opt/unibake/engine/serve.sh]",
                                                       f'/opt/unibake/engine/serve.sh, "{token}"]'))
    elif where == "launch.mounts":
        product.write_text(product.read_text().replace("target: /models/target", f"target: /models/{token}"))
    elif where == "smoke.prompt":
        tp1.write_text(tp1.read_text().replace("smoke: {", f'smoke: {{prompt: "use {token}", '))
    elif where == "product smoke":
        product.write_text(product.read_text() + f'smoke: {{prompt: "use {token}"}}\n')
    elif where == "build.run":
        product.write_text(product.read_text() + "builder: {image: 'localhost/unibake-demo-builder:bookworm'}\n"
                           "kernels:\n  - {name: quant, version: '1', source: images/engine,\n"
                           f"     build: {{run: 'HF_HUB_TOKEN={token} cc -shared -o $OUT/libquant.so x.c'}}}}\n")
    else:
        tp1.write_text(tp1.read_text().replace("smoke: {expect_reply: UNIFIED_TP1_OK,",
                                               f'smoke: {{prompts: [{{prompt: "use {token}", expect: UNIFIED_TP1_OK}}],'))
    result = cli("--config", str(busybox_product))
    assert result.code == 3 and len(result.error_lines) == 1, result.err
    assert f"{busybox_product}/{said}: Hugging Face token" in result.error_lines[0], result.error_lines[0]
    assert "more)" not in result.error_lines[0], result.error_lines[0]  # each value found once
    assert not (busybox_product.parent / "dockerfiles").exists()  # before anything was rendered


def test_a_deliberate_value_allowlisted_in_product_yaml_passes(cli, busybox_product):
    product = busybox_product / "product.yaml"
    product.write_text(product.read_text().replace(
        'env: {SHARED_SETTING: "on"}', 'env: {SHARED_SETTING: "on", DOCS_URL: "https://user:pass@docs.example"}')
        + "sanitise: {allow: ['^https://user:pass@docs\\.example$']}\n")
    assert cli("--config", str(busybox_product), "--stage", "render").code == 0


def test_the_gate_remembers_a_big_files_findings_and_a_damaged_or_foreign_memo_is_scanned_again(tmp_path):
    from unibake.sanitise import scan_context

    token = "ghp_" + "A1b2C3d4" * 5
    lib = tmp_path / "lib.so"
    lib.write_bytes(b"\0" * 1000 + f"token={token}".encode() + b"\0" * 1000)
    import hashlib

    sha = hashlib.sha256(lib.read_bytes()).hexdigest()
    cache = tmp_path / "unibake" / "sanitise"  # (as the user folder's, made here first)
    first = scan_context([("lib.so", lib, sha)], (), cache=cache)
    [memo] = cache.iterdir()
    assert [f.value for f in first] == [token]
    # the memo holds the token whole: private, as the folders made for it (before: 0644 in a 0755 folder)
    assert [oct(p.stat().st_mode & 0o777) for p in (memo, cache, cache.parent)] == ["0o600", "0o700", "0o700"]
    cache.chmod(0o755)  # as an earlier version left it: private again at its next use
    scan_context([("lib.so", lib, sha)], (), cache=cache)
    assert oct(cache.stat().st_mode & 0o777) == "0o700"
    for damaged in ("", "{", '[["not a kind", "x"]]', "[[1, 2]]"):
        memo.write_text(damaged)
        assert [f.value for f in scan_context([("lib.so", lib, sha)], (), cache=cache)] == [token]  # no traceback
    memo.write_text('[["GitHub token", "' + token + '"]]')
    lib.write_bytes(b"\0" * 2000)  # the memo is trusted for the sha256 it is named by, not re-read
    assert [f.value for f in scan_context([("lib.so", lib, sha)], (), cache=cache)] == [token]
    # a linked cache folder is neither read nor written
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "linked").symlink_to(elsewhere)
    scan_context([("lib.so", lib, hashlib.sha256(lib.read_bytes()).hexdigest())], (), cache=tmp_path / "linked" / "sanitise")
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("size", [1000, (16 << 20) + 1000])  # read whole; read around grep's anchors
def test_a_file_swapped_for_a_clean_one_during_the_scan_is_refused_not_passed(tmp_path, size):
    # the plan hashed a file holding a token; swapped for a clean one while the gate read it and back before
    # the build context was written (which checks the plan's hash), the token was baked unscanned
    import hashlib

    from unibake.sanitise import scan_context

    token = "ghp_" + "A1b2C3d4" * 5
    lib = tmp_path / "lib.so"
    planned = b"\0" * (size // 2) + f"token={token}".encode() + b"\0" * (size // 2)
    sha = hashlib.sha256(planned).hexdigest()
    lib.write_bytes(planned.replace(token.encode(), b"x" * len(token)))  # what the gate is shown
    with pytest.raises(InputError, match=rf"^images/lib\.so: changed after the plan hashed it \(sha256 {sha[:12]}, now "
                                         r"[0-9a-f]{12}\), while the sanitisation gate read it: the bytes scanned must "
                                         r"be the bytes baked; run again$"):
        scan_context([("images/lib.so", lib, sha)], (), cache=tmp_path / "cache")
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").iterdir())  # no memo of the clean bytes
    lib.write_bytes(planned)  # the bytes the plan hashed: scanned, the token found
    assert [f.value for f in scan_context([("images/lib.so", lib, sha)], ())] == [token]


def test_a_checkout_cannot_bring_memos_that_hide_a_secret(cli, busybox_product, tmp_path):
    # the gate's memos live in the user's cache folder, not in the project a pull request can change
    import shutil

    root = busybox_product.parent
    (root / "images/engine/handle.sh").write_text("#!/bin/sh\ntoken=ghp_" + "A1b2C3d4" * 5 + "\n")
    assert cli("lock", "--config", str(busybox_product)).code == 0
    home = tmp_path / "home"
    found = cli("--config", str(busybox_product), env={"CI": "true", "HOME": str(home)})
    assert found.code == 3 and "GitHub token" in found.error_lines[-1], found.err
    memos = home / ".cache" / "unibake" / "sanitise"
    assert sorted(memos.iterdir()) and not (root / ".cache" / "sanitise").exists()
    # the same memos, each saying "nothing found", planted in the project: not read
    shutil.copytree(memos, root / ".cache" / "sanitise")
    for memo in (root / ".cache" / "sanitise").iterdir():
        memo.write_text("[]")
    again = cli("--config", str(busybox_product), env={"CI": "true", "HOME": str(tmp_path / "other-home")})
    assert again.code == 3 and "GitHub token" in again.error_lines[-1], again.err


TOKEN = b"hf_" + b"A1b2C3d4" * 5  # a Hugging Face token's form


@pytest.mark.parametrize("size", [15 << 20, 18 << 20])  # read whole; read around grep's anchors
def test_a_file_dense_with_anchors_is_scanned_once_and_its_secret_still_found(tmp_path, size):
    # six million "hf_": each anchor's window scanned on its own took minutes and 1.7 GB (a profile
    # author's input could stall every release); merged, each byte is scanned once per rule
    import time

    path = tmp_path / "E=16,N=14336.json"
    filler = b"hf_" * (size // 6)
    path.write_bytes(filler + b"\n" + TOKEN + b"\n" + filler)
    started = time.monotonic()
    found = scan_file(path, "images/tune/tp1/E=16,N=14336.json")
    assert [(f.kind, f.value) for f in found] == [("Hugging Face token", TOKEN.decode())]
    assert time.monotonic() - started < 60  # a hang guard, not a speed target: it was over 180 s


def test_a_big_file_without_newlines_is_scanned_in_chunks_with_bounded_memory(tmp_path, monkeypatch):
    # grep holds a line whole (2 GB with no newline took 4.2 GB); its memory is capped, and past the cap
    # the file is read in chunks that overlap, so a token across a chunk's edge is still found
    from unibake import sanitise

    monkeypatch.setattr(sanitise, "GREP_MEMORY", 32 << 20)  # as 256 MiB is to a file of gigabytes
    path = tmp_path / "blob.json"
    at = 2 * sanitise.CHUNK - 10  # across the second chunk's end
    with open(path, "wb") as fh:
        fh.truncate(64 << 20)  # sparse: no newline in 64 MiB
        fh.seek(at)
        fh.write(b" " + TOKEN + b" ")
    assert sanitise._anchor_offsets([path], sanitise._all_anchors(()))[path] is None  # grep could not bound it
    found = scan_file(path, "images/blob.json")
    assert [(f.where, f.kind) for f in found] == [(f"images/blob.json at byte {at + 1}", "Hugging Face token")]


def test_an_allow_pattern_that_matches_an_empty_value_is_refused_and_the_suggested_ones_pass():
    """'', '.*' or 'x?' is found in every value: it would let every secret through the gate."""
    from unibake.errors import InputError
    from unibake.sanitise import check_allow

    for pattern in ("", ".*", "x?", "|hf_", "(?=)", "^$"):
        with pytest.raises(InputError, match="matches an empty value, so it would let every value through"):
            check_allow(pattern, "--allow")
    for kind, value in SECRETS.items():  # the rule the gate's own message suggests for each finding
        findings = scan_text(f"x {value}\n", "f")
        with pytest.raises(VerificationError) as refused:
            enforce(findings, (), "f")
        suggested = re.search(r"\(e\.g\. '(.*)'\) or with --allow", str(refused.value)).group(1)
        check_allow(suggested, "--allow")
        enforce(findings, (suggested,), "f")
    check_allow(r"^hf_AbCd", "--allow")
    for pattern in (".", r"\w", "[a-z]", "x|hf_AbCd"):  # not empty, but found in almost every value
        with pytest.raises(InputError, match="matches the one-character value '.', so it would let almost every"):
            check_allow(pattern, "--allow")


@pytest.mark.parametrize("pattern", [r"^hf_([a-zA-Z0-9]+)+!$", r"(\w+\s?)+$", r"^(a|aa)+$", r"(a?){30}a{30}",
                                     "a?" * 30 + "a" * 30, r"(hf_\w*)*x", r"(x)\1",
                                     # (a repeated lookaround, taken or not at each copy: 24 letters took 1-4 s)
                                     r"(?:a(?=a)*)*c", r"(?:OK(?:(?!x))*)*!", r"(?:\w(?:(?!\s))*)*!"])
def test_an_allow_pattern_that_could_backtrack_without_end_is_refused(pattern):
    """Searched in every finding in this process, with no bound: (a?){30}a{30} alone takes 37 s."""
    from unibake.sanitise import check_allow

    with pytest.raises(InputError, match=r"^--allow .* could backtrack without end \("):
        check_allow(pattern, "--allow")


@pytest.mark.parametrize("pattern", [r"^hf_[A-Za-z0-9]{30,}$", r"^(sk|pk)-[a-z0-9]+$", r"^hf_A.*Ij$", r"^hf_AbCd",
                                     r"^10\.0\.0\.5:50051$", r"^/home/[a-z]+/\.cache(?:/[a-z0-9._-]+)*$",
                                     r"^https://[a-z]+:[^@]+@pypi\.example\.com/simple$", r"^(?:\d{1,3}\.){3}\d{1,3}$",
                                     r"^ghp_[A-Za-z0-9]{36}$", r"\bAKIA[0-9A-Z]{16}\b",
                                     # capturing groups, as their (?:...) forms (before: refused as nested)
                                     r"^v(\.[0-9]+)*$", r"^OK( \w+)*$", r"^ver(\d+)(,\d+)*$"])
def test_the_allow_patterns_people_write_are_accepted(pattern):
    from unibake.sanitise import check_allow

    check_allow(pattern, "--allow")


def test_an_allow_pattern_that_would_hang_on_a_token_is_refused_at_the_plan_in_bounded_time(busybox_product):
    """The plan searched '^hf_([a-zA-Z0-9]+)+!$' in the profile's 40-letter token: 6 s at 25 letters, doubling
    with each more, so it never ended. Run as a process of its own, so that a hang fails this test, not the suite."""
    import os
    import subprocess
    import sys

    from ..conftest import REPO

    product = busybox_product / "product.yaml"
    text = product.read_text()
    assert 'env: {SHARED_SETTING: "on"}' in text
    product.write_text(text.replace('env: {SHARED_SETTING: "on"}', 'sanitise: {allow: ["^hf_([a-zA-Z0-9]+)+!$"]}\n'
                                    'env: {SHARED_SETTING: "on", HF_TOKEN: hf_' + "a" * 40 + "}"))
    done = subprocess.run([sys.executable, str(REPO / "build.py"), "build", "--stage", "render", "--config",
                           str(busybox_product)], capture_output=True, text=True, timeout=60, cwd=REPO,
                          env={**os.environ, "CI": "true"})
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and errors == done.stderr.strip().splitlines()[-1:], done.stderr
    assert "product.yaml:" in errors[0] and "sanitise.allow[0] '^hf_([a-zA-Z0-9]+)+!$' could backtrack without end" \
        in errors[0]
    assert "Traceback" not in done.stderr and not (busybox_product / "dockerfiles").exists()


def test_an_allow_pattern_the_plan_accepts_that_is_slow_on_a_long_value_is_stopped_not_a_hang(monkeypatch):
    # a polynomial pattern (^.*.*.*.*=$: no nesting, so the plan takes it) searched in a secret-named value of
    # 4,000 blanks ran for hours in the run's own process, which re cannot interrupt: it is searched now in a
    # child process, stopped after ALLOW_SECONDS
    import time

    from unibake import sanitise
    from unibake.errors import InputError
    from unibake.sanitise import Finding, check_allow

    check_allow(r"^.*.*.*.*=$", "sanitise.allow[0]")  # (taken at the plan)
    monkeypatch.setattr(sanitise, "ALLOW_SECONDS", 1.0)
    start = time.monotonic()
    with pytest.raises(InputError, match=r"took longer than 1 s to search in the 1 value\(s\) the sanitisation gate "
                                         r"found \(the longest of 4000 characters\)"):
        sanitise.allowed([Finding(where="tp1.yaml: env.API_TOKEN", kind="a secret-named variable",
                                  value=" " * 4000)],
                         [r"^.*.*.*.*=$"])
    assert time.monotonic() - start < 8
    token = Finding(where="tp1.yaml: env.HF_TOKEN", kind="a Hugging Face token", value="hf_" + "a" * 30)
    other = Finding(where="tp1.yaml: env.API_KEY", kind="a secret-named variable", value="s3cr3t-value")
    assert sanitise.allowed([token, other], [r"^hf_[a-z]{30}$"]) == [other]  # a pattern that ends: as before


HF_SAMPLE = "hf_" + "AbCdEfGh12" * 3 + "Ij"


def test_a_token_in_a_profile_comment_is_refused_at_the_plan_as_the_kit_carries_the_file(busybox_product):
    # (before: only parsed values were scanned; the reconstruct kit of every release carries the YAML whole)
    from unibake.plan import make_plan

    tp1 = busybox_product / "tp1.yaml"
    lines = tp1.read_text().splitlines(keepends=True)
    tp1.write_text("".join(lines[:1]) + f"# old: HF_TOKEN={HF_SAMPLE} (see /home/alice/notes)\n" + "".join(lines[1:]))
    with pytest.raises(VerificationError, match=r"^sanitisation: profiles/tp1\.yaml:2: Hugging Face token \(hf_A…Ij, "
                                                r"35 characters\) \(and 1 more\) in the profile files \(the release's "
                                                r"reconstruct kit carries every profile file of the product as it is, "
                                                r"comments too\)"):
        make_plan(busybox_product, verify_lock=False)
    product = busybox_product / "product.yaml"  # allowed, as a value found by the value scan is
    product.write_text(product.read_text() + "sanitise: {allow: ['^hf_AbCd', '^/home/alice$']}\n")
    make_plan(busybox_product, verify_lock=False)


def test_a_binary_attachment_is_scanned_as_bytes(busybox_product):
    # (before: an attachment with a NUL in its first 8 KiB, a results database, was published unscanned)
    from unibake.plan import make_plan

    notes = busybox_product.parent / "notes"
    notes.mkdir()
    (notes / "results.db").write_bytes(b"SQLite format 3\0" + b"\0" * 5000 + f"token={HF_SAMPLE}".encode() + b"\0" * 99)
    product = busybox_product / "product.yaml"
    product.write_text(product.read_text() + "notes: {attachments: [notes/results.db]}\n")
    with pytest.raises(VerificationError, match=r"^sanitisation: notes/results\.db at byte 5022: Hugging Face token "
                                                r"\(hf_A…Ij, 35 characters\) in the notes' files"):
        make_plan(busybox_product, verify_lock=False)


def test_the_builder_s_name_in_an_attachment_is_refused_at_the_plan_as_at_publish(busybox_product):
    # (before: the plan scanned the notes' files without the builder's name and home; publish, with them, refused
    # the release after the build, the export, the round trip and the gates)
    from unibake.plan import make_plan

    notes = busybox_product.parent / "notes"
    notes.mkdir()
    (notes / "results.db").write_bytes(b"SQLite format 3\0" + b"\0" * 100 + b"run by runner on ci\0")
    product = busybox_product / "product.yaml"
    product.write_text(product.read_text() + "notes: {attachments: [notes/results.db]}\n")
    with pytest.raises(VerificationError, match=r"^sanitisation: notes/results\.db at byte 123: the builder's home or "
                                                r"user name \(ru…, 6 characters\) in the notes' files"):
        make_plan(busybox_product, verify_lock=False, identity=("runner",))
    make_plan(busybox_product, verify_lock=False, identity=("alice",))


@pytest.mark.parametrize("name", ["SMTP_PASS", "DB_PASS", "RABBITMQ_DEFAULT_PASS", "AUTHORIZATION", "HTTP_AUTHORIZATION",
                                  "AZURE_STORAGE_CONNECTION_STRING", "db_conn_str"])
def test_more_names_that_mean_a_secret_are_found(name):
    assert [f.where for f in scan_env([(name, "v4lue")], "env")] == [f"env {name}"]


@pytest.mark.parametrize("name", ["BYPASS_CACHE", "PATH", "PASS_THROUGH", "COMPASS", "PATCH_LEVEL", "AUTHOR",
                                  "AUTHORIZATION_MODE", "KAFKA_CONNECTION_STRATEGY", "GRPC_MAX_CONNECTION_STREAMS",
                                  "DB_CONNECTION_STRICT", "URL_PAT", "LOG_PAT"])
def test_names_that_only_look_like_a_secret_s_are_not(name):
    assert scan_env([(name, "v")], "env") == []


@pytest.mark.parametrize("value", ["1", "true", "False", "on", "none", "256"])
def test_a_switch_or_a_small_count_is_no_secret_whatever_its_name(value):
    # TWO_PASS=1 or ENABLE_AUTH=true is a setting: refused, it needed an allow pattern for a value of one character
    assert scan_env([("TWO_PASS", value), ("NCCL_AUTH", value)], "env") == []
    assert [f.where for f in scan_env([("TWO_PASS", "1234"), ("DB_PASSWORD", "hunter2")], "env")] == \
        ["env TWO_PASS", "env DB_PASSWORD"]


def test_a_utf16_attachment_is_read_as_text():
    found = scan_release_texts({"results.csv": f"name,key\r\nrun,{HF_SAMPLE}\r\n".encode("utf-16")}, ())
    assert [(f.where, f.kind) for f in found] == [("results.csv:2", "Hugging Face token")]


def test_a_verify_engine_on_a_private_network_is_refused_at_the_plan_not_after_every_stage(tmp_path, busybox_product):
    # (before: the build, the export, the round trip and the gates ran, then publish refused VALIDATION.json and
    # the notes, which record the engine of the round trip)
    from unibake.pipeline import BUILD, Request, run_stages, selection

    from .test_supply_chain import Quiet

    def connect(address):
        raise AssertionError(f"reached the engine {address}")

    request = Request(env={}, cwd=tmp_path, out=tmp_path / "release", version="1.0", config=str(busybox_product),
                      require_lock=False, verify_engine="tcp://10.0.0.7:2376")
    with pytest.raises(VerificationError, match=r"^sanitisation: --verify-engine: private network address \(10…, 8 "
                                                r"characters\) in the --verify-engine address \(the release's "
                                                r"VALIDATION\.json and notes record the engine of its round trip\)"):
        run_stages(selection(BUILD), request, Quiet(), connect=connect)
    assert not (tmp_path / "release").exists()
    allowed = Request(env={}, cwd=tmp_path, out=tmp_path / "release", version="1.0", config=str(busybox_product),
                      require_lock=False, verify_engine="tcp://10.0.0.7:2376", allow=(r"^10\.0\.0\.7$",))
    with pytest.raises(AssertionError, match="reached the engine"):  # past the plan, as the user allowed
        run_stages(selection(BUILD), allowed, Quiet(), connect=connect)


@pytest.mark.parametrize("text", ['headers = {"Authorization": f"Bearer {token}"}',
                                  'curl -H "Authorization: Bearer $TOKEN" https://api.example/v1',
                                  '{"auth": "none"}', "the machine learns: login with your password"])
def test_code_that_only_mentions_credentials_is_no_finding(text):
    assert scan_text(text + "\n", "engine/client.py") == []


def test_build_arguments_in_buildkit_s_history_are_found_by_name():
    # found by review: BuildKit (the docker CLI's default since 23.0) writes "RUN |1 NAME=value ... # buildkit"; only
    # the classic builder's "|1 NAME=value" was read for build arguments
    from unibake.sanitise import scan_image

    for line in ("RUN |1 DB_PASSWORD=correct-horse-battery /bin/sh -c make # buildkit",
                 "|1 DB_PASSWORD=correct-horse-battery /bin/sh -c make"):
        findings = scan_image([], {}, [line], "image config of demo:1")
        assert [(f.where, f.kind) for f in findings] == [
            ("image config of demo:1: history[0] build argument DB_PASSWORD", "secret in the environment")], line


@pytest.mark.parametrize("words, where", [
    ('"--api-key", "team-key-7f3a9c21"', "engine.command[3]"), ('"--api-key=team-key-7f3a9c21"', "engine.command[2]"),
    ('"--hf-token", "my-hub-secret-value"', "engine.command[3]")])
def test_a_secret_given_to_an_engine_option_is_refused_as_one_in_its_env(cli, busybox_product, words, where):
    # found by review: engine.command [vllm, serve, --api-key, VALUE]: the word was checked by its form alone, and a
    # team key of no known form was baked into the image's command and the kit
    product = busybox_product / "product.yaml"
    product.write_text(product.read_text().replace("/opt/unibake/engine/serve.sh]",
                                                   f"/opt/unibake/engine/serve.sh, {words}]"))
    result = cli("--config", str(busybox_product), "--stage", "render")
    assert result.code == 3 and len(result.error_lines) == 1, result.err
    assert f"product.yaml:10: {where}: secret given to an option (" in result.error_lines[0], result.error_lines[0]


@pytest.mark.parametrize("words", ['"--api-key", "${API_KEY}"', '"--api-key=$API_KEY"',
                                   '"--max-num-batched-tokens", "8192"', '"--tokenizer", "hf-internal/llama"',
                                   '"--password-file", "/run/secrets/db"', '"--api-key", "--other"'])
def test_an_option_given_a_reference_a_count_or_a_secret_s_place_passes(cli, busybox_product, words):
    product = busybox_product / "product.yaml"
    product.write_text(product.read_text().replace("/opt/unibake/engine/serve.sh]",
                                                   f"/opt/unibake/engine/serve.sh, {words}]"))
    result = cli("--config", str(busybox_product), "--stage", "render")
    assert result.code == 0, result.err


def test_a_secret_in_a_label_is_refused_by_its_key(cli, busybox_product):
    product = busybox_product / "product.yaml"
    product.write_text(product.read_text() + 'labels: {api_token: "team-key-7f3a9c21", org.example.team: ml}\n')
    result = cli("--config", str(busybox_product), "--stage", "render")
    assert result.code == 3 and "labels.api_token: secret in the environment (" in result.error_lines[0], result.err


def test_an_image_s_command_entrypoint_health_check_and_author_are_scanned_beside_env_labels_and_history():
    # found by review: `archive IMAGE` of an image made with docker commit -c 'CMD [..., "--hf-token", ...]' -a ...:
    # only Env, Labels and history were read; its command and author shipped unread
    from unibake.sanitise import scan_added

    from ..fake_engine import FakeEngine

    class Configured(FakeEngine):  # an engine that gives an image's settings, as the real one does
        def image_config(self, ref):
            image = self._find(ref)
            return {"config": image.parsed.get("config") or {}, "author": image.parsed.get("author", "")}

    engine = Configured()
    shared = {"Cmd": ["sh"], "Healthcheck": {"Test": ["CMD", "true"]}}
    engine.add({"config": shared, "author": "base maintainers", "rootfs": {"diff_ids": []}}, [], tag="base:1")
    token = SECRETS["Hugging Face token"]
    engine.add({"config": {**shared, "Cmd": ["serve", "--api-key", "team-key-7f3a9c21"],
                           "Entrypoint": ["/entry.sh", f"--token={token}"], "OnBuild": ["RUN echo /home/alice"]},
                "author": "built in /home/alice", "rootfs": {"diff_ids": []}}, [], tag="demo:1")
    found = {(f.where, f.kind) for f in scan_added(engine, "demo:1", "base:1", ())}
    assert found == {
        ("image config of demo:1: Cmd[2]", "secret given to an option"),
        ("image config of demo:1: Entrypoint:1", "Hugging Face token"),
        ("image config of demo:1: Entrypoint[1]", "secret given to an option"),
        ("image config of demo:1: OnBuild:1", "home folder"),
        ("image config of demo:1: author:1", "home folder")}, found
    assert scan_added(engine, "base:1", None, ()) == []  # the base's own settings: nothing
