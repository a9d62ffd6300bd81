"""Every kind of bad input, through the whole pipeline: one `error:` line, exit 2, nothing built
(the autouse fixture fails any attempt to reach an engine) and nothing written."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


def case_yaml_syntax(p):
    (p / "tp2.yaml").write_text("profile: tp2\ngpus: [2\n")


def case_yaml_control_character(p):  # a form feed (a page break some editors keep): PyYAML's error is two lines
    (p / "tp2.yaml").write_text("profile: tp2\ngpus: 2\n\x0c\n")


def case_wrong_type(p):
    edit(p / "tp1.yaml", "gpus: 1", "gpus: one")


def case_unknown_key(p):
    edit(p / "tp1.yaml", "gpus: 1", "gpu: 1")


def case_missing_required(p):
    edit(p / "product.yaml", "version: 0.1.0\n", "")


def case_duplicate_key(p):
    edit(p / "tp1.yaml", "gpus: 1", "gpus: 1\ngpus: 2")


def case_extends_cycle(p):
    edit(p / "tp1.yaml", "profile: tp1", "profile: tp1\nextends: tp2.yaml")


def case_fragment_names_a_profile(p):
    (p / "shared").mkdir()
    (p / "shared" / "nccl.yaml").write_text("profile: nccl\nenv: {NCCL_ALGO: Ring}\n")
    edit(p / "tp2.yaml", "extends: tp1.yaml", "extends: shared/nccl.yaml")


def case_profile_in_a_subfolder(p):  # was no profile, without a word: the image had one profile fewer
    (p / "sub").mkdir()
    (p / "sub" / "tp5.yaml").write_text((p / "tp1.yaml").read_text().replace("profile: tp1", "profile: tp5"))


def case_fragment_nothing_extends_does_not_parse(p):  # was never read, so never refused
    (p / "shared").mkdir()
    (p / "shared" / "broken.yaml").write_text("env: {NCCL_ALGO: [Ring\n")


def case_missing_parent(p):
    edit(p / "tp2.yaml", "extends: tp1.yaml", "extends: tp0.yaml")


def case_duplicate_profile(p):
    (p / "tp3.yaml").write_text("profile: tp1\ngpus: 3\n")


def case_lock_mismatch(p):
    (p.parent / "images/tune/tp1/cache-1.json").write_text('{"changed": true}\n')


def case_missing_input(p):
    (p.parent / "images/engine/handle.sh").unlink()


def case_source_dotdot(p):
    edit(p / "tp1.yaml", "source: images/tune/tp1", "source: ../../etc")


def case_source_absolute(p):
    edit(p / "tp1.yaml", "source: images/tune/tp1", "source: /etc")


def case_symlink_out(p):
    os.symlink("/etc/hostname", p.parent / "images/tune/tp1/cache-9.json")


def case_env_newline(p):
    edit(p / "tp1.yaml", "env: {NCCL_ALGO: Tree}", 'env: {NCCL_ALGO: "Tree\\nRUN rm -rf /"}')


def case_env_nul(p):
    edit(p / "tp1.yaml", "env: {NCCL_ALGO: Tree}", 'env: {NCCL_ALGO: "Tree\\0"}')


def case_env_key_hostile(p):
    edit(p / "tp1.yaml", "env: {NCCL_ALGO: Tree}", 'env: {"A=1 B": Tree}')


def case_env_key_quote(p):
    edit(p / "tp1.yaml", "env: {NCCL_ALGO: Tree}", "env: {'A\"B': Tree}")


def case_env_key_dollar(p):
    edit(p / "tp1.yaml", "env: {NCCL_ALGO: Tree}", "env: {'$HOME': Tree}")


def case_env_very_long(p):
    edit(p / "tp1.yaml", "env: {NCCL_ALGO: Tree}", "env: {NCCL_ALGO: " + "x" * 10000 + "}")


def case_label_newline(p):
    edit(p / "product.yaml", "env:", 'labels: {com.example.note: "a\\nb"}\nenv:')


def case_label_key_backslash(p):
    edit(p / "product.yaml", "env:", 'labels: {"com.example\\\\note": x}\nenv:')


def case_version_newline(p):
    edit(p / "product.yaml", "version: 0.1.0", 'version: "0.1.0\\nRUN id"')


def case_version_quote(p):
    edit(p / "product.yaml", "version: 0.1.0", "version: '0.1\"0'")


def case_reserved_env(p):
    edit(p / "tp1.yaml", "env: {NCCL_ALGO: Tree}", "env: {LD_LIBRARY_PATH: /x}")


def case_topology_env_on_several_nodes(p):  # run.sh passes -e MASTER_PORT from topology: this never applied
    edit(p / "tp2.yaml", "env: {NCCL_ALGO: Ring}", "env: {NCCL_ALGO: Ring, MASTER_PORT: '1234'}\ntopology: {nodes: 2}")


def case_topology_env_in_the_product(p):  # found by probing: the product's line was named, not the profile of 2 nodes
    edit(p / "product.yaml", 'env: {SHARED_SETTING: "on"}', 'env: {SHARED_SETTING: "on", MASTER_ADDR: 10.0.0.1}')
    edit(p / "tp2.yaml", "env: {NCCL_ALGO: Ring}", "env: {NCCL_ALGO: Ring}\ntopology: {nodes: 2}")


def case_engine_command_an_option(p):  # found by probing: `exec -x /bin/sh`: bash and busybox refuse it at start
    edit(p / "product.yaml", "command: [/bin/sh,", "command: [-x, /bin/sh,")


def case_topology_more_nodes_than_the_gate_can_start(p):  # its gate failed at the last rank, after the build
    edit(p / "tp2.yaml", "env: {NCCL_ALGO: Ring}", "env: {NCCL_ALGO: Ring}\ntopology: {nodes: 1024, master_port: 29501}")


def case_topology_env_in_an_env_file(p):  # the entrypoint exports NNODES from topology before the env
    (p.parent / "images/tp2.env").write_text("A=1\nNNODES=4\n")
    lock_also(p, "images/tp2.env")
    edit(p / "tp2.yaml", "env: {NCCL_ALGO: Ring}", "env: {NCCL_ALGO: Ring}\nenv_file: images/tp2.env\n"
                                                   "topology: {nodes: 2}")


def case_base_by_tag(p):
    edit(p / "product.yaml", 'base: {image: "localhost/unibake-busybox:1"}',
         'base: {image: "localhost/unibake-busybox:1", require_digest: true}')


def case_base_of_a_platform_by_tag(p):  # base.id pins base.image only: the arm64 base is pinned in its own entry
    edit(p / "product.yaml", 'base: {image: "localhost/unibake-busybox:1"}',
         'base: {image: "localhost/unibake-busybox:1", id: "sha256:' + "a" * 64 + '", require_digest: true, '
         'platforms: {linux/arm64: "localhost/unibake-busybox:1-arm64"}}\nplatform: linux/arm64')


def case_port_written_as_another_number(p):  # the smoke gate asks launch.port, where nothing would listen
    edit(p / "tp1.yaml", "gpus: 1", "gpus: 1\nargs: [--port, '8000']")


def case_port_written_with_a_sign(p):  # argparse's type=int reads '+8000' as 8000: the check above passed it
    edit(p / "tp1.yaml", "gpus: 1", "gpus: 1\nargs: [--port, '+8000']")


def case_port_in_full_width_digits(p):  # int('８０００') is 8000 too
    edit(p / "tp1.yaml", "gpus: 1", "gpus: 1\nargs: ['--port=\uff18\uff10\uff10\uff10']")


def case_port_option_cut_short(p):  # argparse takes --por for --port when no other option begins so
    edit(p / "tp1.yaml", "gpus: 1", "gpus: 1\nargs: [--por, '8000']")


def case_tensor_parallel_with_a_space(p):  # int(' 4') is 4: the engine starts 4 ranks on 1 GPU
    edit(p / "tp1.yaml", "gpus: 1", "gpus: 1\nargs: [--tp, ' 4']")


def case_tensor_parallel_option_cut_short(p):  # the demo engine's argparse takes --t for --tp
    edit(p / "tp1.yaml", "gpus: 1", "gpus: 1\nargs: [--t, '4']")


def case_base_with_dot_segments(p):  # not a registry host: ".." would walk the engine API's URL
    edit(p / "product.yaml", 'base: {image: "localhost/unibake-busybox:1"}', 'base: {image: "../containers/x"}')


def case_bad_allow_regex(p):
    edit(p / "product.yaml", "env:", "sanitise: {allow: ['(unclosed']}\nenv:")


def case_allow_matches_everything(p):  # found in every value: the gate would let every secret through
    edit(p / "product.yaml", "env:", "sanitise: {allow: ['^hf_A.*Ij$', 'x*']}\nenv:")


def case_allow_that_could_backtrack_without_end(p):  # searched in each finding: 2**40 ways on a 40-letter token
    edit(p / "product.yaml", "env:", "sanitise: {allow: ['^hf_([a-zA-Z0-9]+)+!$']}\nenv:")


def case_smoke_expects_nothing(p):  # every reply contains "": the gate would pass any engine
    edit(p / "tp1.yaml", "expect_reply: UNIFIED_TP1_OK", 'expect_reply: "  ", match: contains')


def case_smoke_skip_blank(p):  # a gate skipped without a reason: the notes could not say why
    edit(p / "tp1.yaml", "expect_reply: UNIFIED_TP1_OK", 'expect_reply: UNIFIED_TP1_OK, skip: "  "')


def case_smoke_skip_too_long(p):  # shown in a row of the notes' table: a reason, not a document
    edit(p / "tp1.yaml", "expect_reply: UNIFIED_TP1_OK", f'expect_reply: UNIFIED_TP1_OK, skip: "{"no GPU " * 43}"')


def lock_also(p, *paths: str) -> None:
    """New input files, locked as `build.py lock` would (so a case fails for its own reason)."""
    with open(p / "inputs.lock", "a") as fh:
        for rel in paths:
            fh.write(f"{hashlib.sha256((p.parent / rel).read_bytes()).hexdigest()}  {rel}\n")


def case_file_name_not_utf8(p):  # the file system gives it as surrogates: no ledger or lock can name it
    (p.parent / "images/tune/tp1").joinpath(os.fsdecode(b"cache-\xff.json")).write_text("{}\n")


def case_file_name_with_a_bidi_override(p):  # the lock would show 'cache-nosj.json' as another name
    (p.parent / "images/tune/tp1").joinpath("cache-\u202enosj.json").write_text("{}\n")


def case_env_file_form_feed(p):  # docker reads one line, "A=x\x0cB=y": a control character in a value
    (p.parent / "images/tp1.env").write_text("A=x\x0cB=y\n")
    lock_also(p, "images/tp1.env")
    edit(p / "tp1.yaml", "env: {NCCL_ALGO: Tree}", "env: {NCCL_ALGO: Tree}\nenv_file: images/tp1.env")


def case_mounts_one_variable(p):
    edit(p / "product.yaml", "mounts: {target: /models/target}",
         "mounts: {target: /models/target, draft-a: /models/a, draft_a: /models/b}")


def case_mounts_one_path(p):
    edit(p / "product.yaml", "mounts: {target: /models/target}", "mounts: {target: /models/x, draft: /models/x}")


def case_mount_over_the_install(p):
    edit(p / "product.yaml", "mounts: {target: /models/target}", "mounts: {target: /opt}")


def case_patches_one_label(p):
    for folder in ("a", "b"):
        (p.parent / "images" / folder).mkdir()
        (p.parent / "images" / folder / "fix.patch").write_text(
            "--- a/handle.sh\n+++ b/handle.sh\n@@ -1,2 +1,2 @@\n #!/bin/sh\n-# One HTTP request on stdin, one "
            f"response on stdout.\n+# {folder}\n")
    lock_also(p, "images/a/fix.patch", "images/b/fix.patch")
    (p / "product.yaml").write_text((p / "product.yaml").read_text() +
                                    "patches: [{file: images/a/fix.patch}, {file: images/b/fix.patch}]\n")


def case_patch_writes_into_the_git_folder(p):  # baked ctx/engine/.git/hooks/x, which no source may bake
    (p.parent / "images/x.patch").write_text("--- /dev/null\n+++ b/.git/hooks/x\n@@ -0,0 +1 @@\n+#!/bin/sh\n")
    lock_also(p, "images/x.patch")
    (p / "product.yaml").write_text((p / "product.yaml").read_text() + "patches: [{file: images/x.patch}]\n")


def case_patch_writes_a_pycache_file(p):
    (p.parent / "images/x.patch").write_text("--- /dev/null\n+++ b/lib/__pycache__/x.pyc\n@@ -0,0 +1 @@\n+x\n")
    lock_also(p, "images/x.patch")
    (p / "product.yaml").write_text((p / "product.yaml").read_text() + "patches: [{file: images/x.patch}]\n")


def case_overlay_into_the_git_folder(p):
    (p / "product.yaml").write_text((p / "product.yaml").read_text()
                                    + "overlays: [{source: images/engine/handle.sh, target: .git/hooks/pre-commit}]\n")


def case_profile_named_all(p):
    (p / "tp3.yaml").write_text("profile: all\ngpus: 3\n")


def case_profile_named_like_a_platform(p):
    (p / "tp3.yaml").write_text("profile: arm64\ngpus: 3\n")


def case_yaml_merge_key(p):
    edit(p / "tp1.yaml", "env: {NCCL_ALGO: Tree}", "env: {<<: {NCCL_ALGO: Ring}, NCCL_P2P_LEVEL: NVL}")


def case_file_overlay_into_a_folder_name(p):
    (p / "product.yaml").write_text((p / "product.yaml").read_text() +
                                    "overlays: [{source: images/tune/tp1/cache-1.json, target: extra/}]\n")


def case_overlay_under_an_engine_file(p):
    (p / "product.yaml").write_text((p / "product.yaml").read_text() +
                                    "overlays: [{source: images/tune/tp1/cache-1.json, target: serve.sh/x.json}]\n")


def case_lock_is_a_folder(p):
    (p / "inputs.lock").unlink()
    (p / "inputs.lock").mkdir()


def case_profile_not_utf8(p):  # found by probing: named by its absolute path and a byte offset alone, no line
    (p / "tp2.yaml").write_bytes((p / "tp2.yaml").read_bytes() + b"# caf\xe9\n")


def case_string_lone_surrogate(p):  # "\ud800": valid YAML, not text; no UTF-8 carries it
    edit(p / "tp1.yaml", "env: {NCCL_ALGO: Tree}", 'env: {NCCL_ALGO: "\\ud800"}')


def case_number_of_many_hex_digits(p):  # fits Python, but printing it in an error fails
    edit(p / "tp1.yaml", "gpus: 1", "gpus: 0x" + "f" * 4000)


def case_number_of_many_digits(p):  # past Python's int_max_str_digits: PyYAML raises ValueError
    edit(p / "tp1.yaml", "gpus: 1", "gpus: " + "9" * 5000)


def case_aliases_expand_a_long_string(p):  # 84 kB of YAML, 80 MB of Dockerfile once expanded
    (p / "tp1.yaml").write_text((p / "tp1.yaml").read_text() +
                                'args: [&a "' + "A" * 4000 + '"' + ", *a" * 20000 + "]\n")


def case_number_yaml_reads_as_another(p):  # YAML 1.1's octal: an image of 8 GPUs
    edit(p / "tp1.yaml", "gpus: 1", "gpus: 010")


def case_overlay_target_name_too_long(p):  # passed the plan; the engine failed to unpack the context (exit 1)
    (p / "product.yaml").write_text((p / "product.yaml").read_text() + "overlays: [{source: images/engine/serve.sh, "
                                    f"target: {'a' * 300}.sh, name: long}}]\n")


def case_mount_path_name_too_long(p):
    edit(p / "product.yaml", "mounts: {target: /models/target}", f"mounts: {{target: /models/{'t' * 256}}}")


def case_profile_file_linked_to_product_yaml(p):  # read as a profile with no name: a KeyError traceback
    (p / "tp3.yaml").symlink_to("product.yaml")


def case_profile_file_linked_to_another(p):  # was "tp1.yaml:1: profile 'tp1' is also defined in tp1.yaml"
    (p / "tp3.yaml").symlink_to("tp1.yaml")


def case_product_yaml_linked_into_a_subfolder(p):  # was "key 'product' can only be set in product.yaml"
    (p / "products").mkdir()
    (p / "product.yaml").rename(p / "products" / "demo.yaml")
    (p / "product.yaml").symlink_to("products/demo.yaml")


def case_profile_file_linked_to_a_file_that_is_no_profile(p):  # the kit carried tp8.txt: "unknown profile"
    (p / "tp8.txt").write_text((p / "tp1.yaml").read_text().replace("profile: tp1", "profile: tp8"))
    (p / "tp8.yaml").symlink_to("tp8.txt")


def case_version_a_date_that_does_not_exist(p):  # was "a number too large to be a value"
    edit(p / "product.yaml", "version: 0.1.0", "version: 2024-02-30")


def case_version_a_date(p):  # was "must be a string, not date", with no word of the quotes
    edit(p / "product.yaml", "version: 0.1.0", "version: 2024-06-01")


def case_profile_file_is_a_symlink_loop(p):  # Path.resolve(): a RuntimeError traceback
    os.symlink("tp3.yaml", p / "tp3.yaml")


def case_profile_file_points_nowhere(p):  # was "profiles/gone.yaml: no such file", naming the target
    os.symlink("gone.yaml", p / "tp3.yaml")


def case_extends_a_symlink_loop(p):
    os.symlink(".base.yaml", p / ".base.yaml")
    edit(p / "tp2.yaml", "extends: tp1.yaml", "extends: .base.yaml")


def case_mount_named_name(p):
    edit(p / "product.yaml", "mounts: {target: /models/target}", "mounts: {target: /models/target, name: /models/n}")


def case_profile_named_like_another_for_a_platform(p):  # tp1-arm64 is the tag of tp1 built for arm64
    (p / "tp3.yaml").write_text("profile: tp1-arm64\ngpus: 3\n")


def case_lock_links_outside(p):
    secret = p.parent / "outside-secret.txt"
    secret.write_text("root:$y$j9T$SECRETSALT$SECRETHASH:20228:0:99999:7:::\n")
    (p / "inputs.lock").unlink()
    (p / "inputs.lock").symlink_to(secret)


def case_overlay_nested_too_deeply(p):  # os.walk recursed into a RecursionError traceback
    deep = p.parent / "images/overlays/deep"
    deep.mkdir(parents=True)
    leaf = deep
    for _ in range(1000):  # one level at a time: pathlib's mkdir(parents=True) recurses too
        leaf = leaf / "d"
        leaf.mkdir()
    (leaf / "x.json").write_text("{}\n")
    (p / "product.yaml").write_text((p / "product.yaml").read_text() +
                                    "overlays: [{source: images/overlays/deep, target: deepx}]\n")


def case_attachment_name_too_long(p):  # written as .NAME.tmp: past 250 bytes only the publish failed
    name = "r" * 246 + ".json"
    (p.parent / "notes").mkdir()
    (p.parent / "notes" / name).write_text("{}\n")
    lock_also(p, f"notes/{name}")
    (p / "product.yaml").write_text((p / "product.yaml").read_text() + f"notes: {{attachments: [notes/{name}]}}\n")


def case_profiles_past_the_engines_line_limit(p):  # the metadata label is one Dockerfile line
    for i in range(100):
        (p / f"x{i:03d}.yaml").write_text(f"profile: x{i:03d}\nextends: tp1.yaml\n")


def case_symlink_loop_in_a_source(p):  # Python 3.11's resolve() raised a RuntimeError traceback
    os.symlink("loop", p.parent / "images/engine/loop")


def case_symlink_loop_of_two_links(p):
    os.symlink("b", p.parent / "images/engine/a")
    os.symlink("a", p.parent / "images/engine/b")


def case_source_folder_is_a_symlink_loop(p):
    os.rename(p.parent / "images/tune/tp1", p.parent / "images/tune/tp1.old")
    os.symlink("tp1", p.parent / "images/tune/tp1")


def case_symlink_pointing_nowhere(p):  # the error named the missing target, with exit 1
    os.symlink("gone", p.parent / "images/engine/dangling")


def case_lock_is_a_symlink_loop(p):
    (p / "inputs.lock").unlink()
    (p / "inputs.lock").symlink_to("inputs.lock")


def case_prebuilt_outside_is_a_symlink_loop(p):
    os.symlink(p.parent / "self.so", p.parent / "self.so")
    edit(p / "product.yaml", "engine:", f'kernels: [{{name: k, version: "1", prebuilt: {p.parent}/self.so}}]\nengine:')


def case_yaml_tag_on_a_mapping(p):  # the tag was dropped without a word: env read as a plain mapping
    edit(p / "tp1.yaml", "env: {NCCL_ALGO: Tree}", "env: !!python/object:os.system {NCCL_ALGO: Tree}")


def case_yaml_tag_on_a_list(p):  # args ["id"], as if the tag were not there
    edit(p / "tp1.yaml", "gpus: 1", 'gpus: 1\nargs: !!python/object/apply:os.system ["id"]')


def case_yaml_tag_on_a_key(p):
    edit(p / "tp1.yaml", "gpus: 1", "!!python/name:os.system gpus: 1")


def case_yaml_set(p):  # a set is a mapping of nulls to YAML; !!omap and !!pairs are lists
    edit(p / "tp1.yaml", "env: {NCCL_ALGO: Tree}", "env: !!set {NCCL_ALGO, B}")


def case_yaml_standard_tag_on_a_value(p):  # the tag was dropped without a word, as on a mapping it is not
    edit(p / "tp1.yaml", "gpus: 1", 'gpus: !!int "1"')


def case_yaml_str_tag_on_a_value(p):
    edit(p / "tp1.yaml", "env: {NCCL_ALGO: Tree}", "env: {NCCL_ALGO: !!str Tree}")


def case_yaml_special_character(p):  # PyYAML's reader refuses it: its message named "<unicode string>", no line
    edit(p / "tp1.yaml", "env: {NCCL_ALGO: Tree}", 'env: {NCCL_ALGO: "Tree\x9b"}')


def case_yaml_line_separator(p):  # YAML breaks the line there, editors do not: gpus read on a line of its own
    edit(p / "tp1.yaml", "gpus: 1", "env_note: x\u2028gpus: 1")


def case_yaml_next_line_in_a_value(p):  # folded into a space: the image got "Tr ee"
    edit(p / "tp1.yaml", "env: {NCCL_ALGO: Tree}", 'env: {NCCL_ALGO: "Tr\x85ee"}')


def case_value_with_a_bidi_override(p):  # "Trojan source" (as a YAML escape): the Dockerfile's line is shown reordered
    edit(p / "tp1.yaml", "env: {NCCL_ALGO: Tree}", "env: {NCCL_ALGO: \"Tree\\u202e;rm -rf\"}")


def case_value_with_a_raw_bidi_isolate(p):  # the character itself in the file, not an escape
    edit(p / "tp1.yaml", "env: {NCCL_ALGO: Tree}", "env: {NCCL_ALGO: Tr\u2067ee}")


def case_value_with_a_zero_width_space(p):  # label values: 'ok' and 'o\u200bk' look alike
    edit(p / "product.yaml", "version: 0.1.0\n", "version: 0.1.0\nlabels: {com.example.team: \"o\\u200bk\"}\n")


def case_value_with_a_c1_control(p):  # U+009B opens a terminal escape where the value is printed
    edit(p / "tp1.yaml", "env: {NCCL_ALGO: Tree}", "env: {NCCL_ALGO: \"Tree\\x9b2J\"}")


def case_env_file_bidi_override(p):
    (p.parent / "images/tp1.env").write_text("A=x\u202eB\n")
    lock_also(p, "images/tp1.env")
    edit(p / "tp1.yaml", "env: {NCCL_ALGO: Tree}", "env: {NCCL_ALGO: Tree}\nenv_file: images/tp1.env")


def case_env_file_c1_control(p):
    (p.parent / "images/tp1.env").write_text("A=x\x9bB\n")
    lock_also(p, "images/tp1.env")
    edit(p / "tp1.yaml", "env: {NCCL_ALGO: Tree}", "env: {NCCL_ALGO: Tree}\nenv_file: images/tp1.env")


def case_context_file_of_8_gib(p):  # sparse: its size is read, never its bytes (hashing it took minutes)
    with open(p.parent / "images/engine/weights.bin", "wb") as fh:
        fh.truncate(8 ** 11)


def case_hard_link_to_a_file_outside_the_project(p):  # a symlink out is refused; a hard link was baked
    outside = p.parent.parent / "id_ed25519"
    outside.write_text("SECRET key of the builder\n")
    os.link(outside, p.parent / "images/engine/key")


def case_key_of_a_megabyte(p):  # an explicit key ('? '), which has no length limit: quoted whole in the error
    (p / "tp1.yaml").write_text((p / "tp1.yaml").read_text() + "labels:\n  ? " + "a" * 1_000_000 + "\n  : x\n")


def case_source_is_the_git_folder(p):  # its objects are zlib-compressed: the secret scan reads no history
    os.makedirs(p.parent / ".git/objects")
    (p.parent / ".git/config").write_text("[core]\n")
    (p / "product.yaml").write_text((p / "product.yaml").read_text() + "overlays: [{source: .git, target: vcs}]\n")


def case_source_inside_a_git_folder(p):
    os.makedirs(p.parent / "images/engine/.git")
    (p.parent / "images/engine/.git/config").write_text("[core]\n")
    (p / "product.yaml").write_text((p / "product.yaml").read_text()
                                    + "overlays: [{source: images/engine/.git/config, target: vcs.conf}]\n")


def case_check_that_runs_nothing(p):  # sh -c '' exits 0: it passed every self-check
    (p / "product.yaml").write_text((p / "product.yaml").read_text()
                                    + "checks: [{name: a, run: 'true'}, {name: b, run: ' '}]\n")


def case_kernel_build_runs_nothing(p):  # sh -c '' exits 0: a kernel build that runs nothing, as that check
    kernel = "{name: k, version: '1', source: images/engine, build: {run: ''}}"
    (p / "product.yaml").write_text((p / "product.yaml").read_text() + f"kernels: [{kernel}]\n")


def case_check_named_twice(p):  # self-check's "check a failed" could not say which
    (p / "product.yaml").write_text((p / "product.yaml").read_text()
                                    + "checks: [{name: a, run: 'true'}, {name: a, run: 'false'}]\n")


def case_symlink_into_the_git_folder(p):  # .git/config (a token in a remote's URL) baked through a link
    os.makedirs(p.parent / ".git")
    (p.parent / ".git/config").write_text("[core]\n")
    (p.parent / "images/engine/vcs.conf").symlink_to("../../.git/config")


def case_source_linked_to_the_git_folder(p):
    os.makedirs(p.parent / ".git/objects")
    (p.parent / ".git/config").write_text("[core]\n")
    (p.parent / "images/vcs").symlink_to("../.git")
    (p / "product.yaml").write_text((p / "product.yaml").read_text() + "overlays: [{source: images/vcs, target: vcs}]\n")


def case_bidi_override_in_a_comment(p):  # the reviewer sees "gpus: 1 # (4 on the cluster)" reordered
    edit(p / "tp1.yaml", "gpus: 1", "gpus: 1 # \u202e)retsulc eht no 4(")


def case_env_file_bidi_override_in_a_comment(p):
    (p.parent / "images/tp1.env").write_text("# \u2067note\u2069\nA=x\n")
    lock_also(p, "images/tp1.env")
    edit(p / "tp1.yaml", "env: {NCCL_ALGO: Tree}", "env: {NCCL_ALGO: Tree}\nenv_file: images/tp1.env")


def case_yaml_lone_carriage_return(p):  # "cat" shows the comment alone; YAML reads base: on a line of its own
    edit(p / "product.yaml", "base: {", "# the base is pinned below\rbase: {")


def case_engine_command_of_an_empty_program(p):  # built, exported, then the container could not start
    edit(p / "product.yaml", "  command: [", "  command: [\" \", ")


def case_extends_chain_too_long(p):  # c1000 extends c999 ... extends c1: a RecursionError traceback
    (p / "c1.yaml").write_text("profile: c1\ngpus: 1\n")
    for i in range(2, 1001):
        (p / f"c{i}.yaml").write_text(f"profile: c{i}\nextends: c{i - 1}.yaml\n")


def case_tune_cache_with_merge_conflict_markers(p):  # baked, counted, released; it failed on the GPU node
    (p.parent / "images/tune/tp1/cache-1.json").write_text('{"block": 64,\n<<<<<<< HEAD\n"warps": 4}\n')


def case_tune_cache_saved_empty(p):
    (p.parent / "images/tune/tp2/cache-3.json").write_text("")


def case_tune_cache_in_a_subfolder_cut_short(p):  # baked though not counted
    (p.parent / "images/tune/tp1/old").mkdir()
    (p.parent / "images/tune/tp1/old/cache-0.json").write_text('{"block": [64, 128')


def case_tune_cache_nested_too_deep(p):  # json.loads raises RecursionError, no JSONDecodeError
    (p.parent / "images/tune/tp1/cache-2.json").write_text("[" * 100_000)


def case_kernel_of_another_platform_only(p):  # its arm64 wheel alone: "needs either source: or prebuilt:"
    kernel = "{name: quant, version: '1', platforms: {linux/arm64: images/q.whl}}"
    (p / "product.yaml").write_text((p / "product.yaml").read_text() + f"kernels: [{kernel}]\n")


def case_kernel_output_listed_twice(p):  # was loaded, counted and listed twice
    kernel = "{name: k, version: '1', source: images/engine, build: {make: all}, outputs: [libk.so, libk.so]}"
    (p / "product.yaml").write_text((p / "product.yaml").read_text() + f"kernels: [{kernel}]\n")


def case_kernel_outputs_empty(p):  # was taken as the default, lib<name>.so
    kernel = "{name: k, version: '1', source: images/engine, build: {make: all}, outputs: []}"
    (p / "product.yaml").write_text((p / "product.yaml").read_text() + f"kernels: [{kernel}]\n")


def case_platforms_key_twice_by_variant(p):  # both name linux/arm64: which base was meant?
    edit(p / "product.yaml", 'base: {image: "localhost/unibake-busybox:1"}',
         'base: {image: "localhost/unibake-busybox:1", platforms: {linux/arm64: "a:1", linux/arm64/v8: "b:1"}}')


def case_visible_devices_with_an_empty_item(p):  # CUDA stops at it: GPU 1 hidden from a profile of 2
    edit(p / "tp2.yaml", "env: {NCCL_ALGO: Ring}", "env: {NCCL_ALGO: Ring, CUDA_VISIBLE_DEVICES: '0,,1'}")


def case_gpu_device_ordinal_past_the_profiles_gpus(p):  # ROCm's HIP reads it as HIP_VISIBLE_DEVICES
    edit(p / "tp1.yaml", "env: {NCCL_ALGO: Tree}", "env: {NCCL_ALGO: Tree, GPU_DEVICE_ORDINAL: '4'}")


def case_visible_devices_fewer_than_the_profiles_gpus(p):  # the engine would start on 1 GPU of the 2 it needs
    edit(p / "tp2.yaml", "env: {NCCL_ALGO: Ring}", "env: {NCCL_ALGO: Ring, CUDA_VISIBLE_DEVICES: '1'}")


def case_model_name_empty(p):  # baked as MODEL_NAME: a model of no name, which the smoke gate asked for
    edit(p / "product.yaml", "model_name: tiny", "model_name: ''")


def case_model_name_blank(p):
    edit(p / "product.yaml", "model_name: tiny", "model_name: '  '")


def case_mount_hides_a_system_folder(p):  # read-only weights over /usr: no shell, no python; the gate mounts none
    edit(p / "product.yaml", "mounts: {target: /models/target}", "mounts: {target: /usr/local}")


def case_mount_inside_proc(p):  # runc refuses it: the container never starts on the GPU machine
    edit(p / "product.yaml", "mounts: {target: /models/target}", "mounts: {target: /proc/models}")


def case_tensor_parallel_past_the_profiles_gpus(p):  # vLLM needs 4 GPUs, the container has 1: fails at start
    edit(p / "tp1.yaml", "gpus: 1", "gpus: 1\nargs: [--tensor-parallel-size, '4']")


def case_shm_size_without_a_unit(p):  # docker reads it as bytes: a /dev/shm of one page
    (p / "tp2.yaml").write_text((p / "tp2.yaml").read_text() + "topology: {ipc: private, shm_size: '16'}\n")


def case_infiniband_device_without_rdma(p):  # no memlock: ibv_reg_mr fails on the GPU node
    (p / "tp2.yaml").write_text((p / "tp2.yaml").read_text() + "devices: {extra: [/dev/infiniband]}\n")


def case_tune_cache_with_nan(p):  # Python's json.dump of float("nan"): a strict reader refuses the file
    (p.parent / "images/tune/tp1/cache-2.json").write_text('{"block": 64,\n "score": NaN}\n')


def case_tune_cache_with_infinity(p):
    (p.parent / "images/tune/tp2/cache-3.json").write_text('[1.5,\n "Infinity",\n -Infinity]\n')


def case_tune_cache_with_a_number_too_large(p):  # found by probing: Python's json reads it as Infinity
    (p.parent / "images/tune/tp1/cache-2.json").write_text('{"block": 64,\n "score": 1e999999}\n')


def case_patch_makes_a_folder_path(p):  # found by probing: passed the plan, then the engine refused the context
    (p.parent / "images/x.patch").write_text("--- /dev/null\n+++ b/newdir/\n@@ -0,0 +1 @@\n+x = 1\n")
    lock_also(p, "images/x.patch")
    (p / "product.yaml").write_text((p / "product.yaml").read_text() + "patches: [{file: images/x.patch}]\n")


def case_patch_of_a_name_git_quotes(p):  # was "... is not the relative path of a file inside the engine folder"
    (p.parent / "images/x.patch").write_text('--- /dev/null\n+++ "b/caf\\303\\251.sh"\n@@ -0,0 +1 @@\n+x = 1\n')
    lock_also(p, "images/x.patch")
    (p / "product.yaml").write_text((p / "product.yaml").read_text() + "patches: [{file: images/x.patch}]\n")


def case_patch_with_crlf_line_ends(p):  # found by probing: "'serve.sh\r' is not the relative path of a file"
    (p.parent / "images/x.patch").write_bytes(b"--- a/handle.sh\r\n+++ b/handle.sh\r\n@@ -1 +1 @@\r\n-#!/bin/sh\r\n"
                                              b"+#!/bin/sh -e\r\n")
    lock_also(p, "images/x.patch")
    (p / "product.yaml").write_text((p / "product.yaml").read_text() + "patches: [{file: images/x.patch}]\n")


def case_fragment_that_is_a_symlink_to_a_profile(p):  # found by probing: tp1 became tp2, fragment rules skipped
    (p / "shared").mkdir()
    os.symlink("../tp2.yaml", p / "shared/x.yaml")
    edit(p / "tp1.yaml", "profile: tp1\n", "profile: tp1\nextends: shared/x.yaml\n")


def case_fragment_linked_into_another_subfolder(p):  # the kit carried the file, not the link: its tp1 did not render
    (p / "frag").mkdir()
    (p / "frag/y.yaml").write_text("env: {NCCL_ALGO: Ring}\n")
    (p / "shared").mkdir()
    os.symlink("../frag/y.yaml", p / "shared/x.yaml")


def case_extends_through_a_linked_folder(p):
    (p / "shared").mkdir()
    (p / "shared/x.yaml").write_text("env: {NCCL_ALGO: Ring}\n")
    os.symlink("shared", p / "sh2")
    edit(p / "tp1.yaml", "profile: tp1\n", "profile: tp1\nextends: sh2/x.yaml\n")


def case_key_of_topology_at_the_top(p):  # found by probing: "did you mean 'notes'?", a product-only key
    (p / "tp2.yaml").write_text((p / "tp2.yaml").read_text() + "nodes: 2\n")


def case_tune_cache_with_a_key_twice(p):  # a merge that kept both sides' line: Python keeps the last, C++ the first
    (p.parent / "images/tune/tp1/cache-2.json").write_text('{"64": {"num_warps": 4, "num_warps": 8}}\n')


def case_tune_cache_with_a_byte_order_mark(p):  # json.loads of bytes skips it; the engine's json.load refuses it
    (p.parent / "images/tune/tp1/cache-2.json").write_bytes(b'\xef\xbb\xbf{"block": 64}\n')


def case_tune_cache_saved_as_utf16(p):  # json.loads of bytes reads UTF-16; the engine's open() reads UTF-8
    (p.parent / "images/tune/tp2/cache-1.json").write_bytes('\ufeff{"block": 64}\n'.encode("utf-16-le"))


def case_tune_cache_with_an_integer_of_5000_digits(p):  # Python's json: ValueError 'Exceeds the limit'
    (p.parent / "images/tune/tp1/cache-2.json").write_text('{"block": ' + "6" * 5000 + "}\n")


def case_tune_cache_not_utf8(p):
    (p.parent / "images/tune/tp1/cache-2.json").write_bytes(b'{"name": "\xff"}')


def case_engine_program_not_executable(p):  # built, exported, round-tripped; then every gate: Permission denied
    (p.parent / "images/engine/serve.sh").chmod(0o644)
    edit(p / "inputs.lock", " *images/engine/serve.sh", "  images/engine/serve.sh")  # locked as it now is
    edit(p / "product.yaml", "command: [/bin/sh, /opt/unibake/engine/serve.sh]",
         "command: [/opt/unibake/engine/serve.sh]")


def case_engine_program_misspelt(p):
    edit(p / "product.yaml", "command: [/bin/sh, /opt/unibake/engine/serve.sh]",
         "command: [/opt/unibake/engine/serv.sh, --port, '${PORT}']")


YAML_CASES = {name[5:]: fn for name, fn in sorted(globals().items()) if name.startswith("case_")}
# what the error line must say, where an earlier check could refuse the same input for another reason
SAYS = {
    "patch_of_a_name_git_quotes": "holds a character a patched path may not: each of its parts is letters, digits and "
                                  ". _ + - (no spaces, ASCII only) (git writes a name of other characters in quotes",
    "version_a_date_that_does_not_exist": "product.yaml:3: '2024-02-30' reads as a date, and there is no such date (",
    "version_a_date": "product.yaml:3: key 'version' must be a string, not date; put it in quotes: YAML reads an "
                      "unquoted YYYY-MM-DD as a date",
    "yaml_control_character": "tp2.yaml:3: holds the character U+000C, which YAML does not allow in a file",
    "allow_matches_everything": "sanitise.allow[1] 'x*' matches an empty value, so it would let every value through",
    "allow_that_could_backtrack_without_end": "sanitise.allow[0] '^hf_([a-zA-Z0-9]+)+!$' could backtrack without end",
    "env_file_form_feed": "images/tp1.env:1: the value of A contains a control character ('\\x0c')",
    "mounts_one_path": "both mount at /models/x",
    "topology_env_on_several_nodes": "tp2.yaml:5: env key 'MASTER_PORT' would never take effect: profile 'tp2' runs "
                                     "on 2 nodes, where it is set from topology: (use topology.master_port)",
    "engine_command_an_option": "product.yaml:10: engine.command[0] is '-x': the first word is the program to run, "
                                "and the entrypoint's exec would read this one as an option of its own",
    "topology_env_in_the_product": "product.yaml:11: env key 'MASTER_ADDR' would never take effect: profile 'tp2' "
                                   "runs on 2 nodes, where it is set from topology:",
    "topology_more_nodes_than_the_gate_can_start": "tp2.yaml:6: key 'topology.nodes' is 1024, more ranks than the "
                                                   "smoke gate can start",
    "topology_env_in_an_env_file": "images/tp2.env:2: env key 'NNODES' would never take effect",
    "patches_one_label": "'fix.patch' is listed twice",
    "yaml_merge_key": "YAML merge keys ('<<') are not supported",
    "file_overlay_into_a_folder_name": "a file overlay's target is the file it becomes",
    "overlay_under_an_engine_file": "'serve.sh' is a file of the engine",
    "profile_not_utf8": "tp2.yaml:7: not UTF-8 text (invalid continuation byte at byte ",
    "file_name_not_utf8": "'images/tune/tp1/cache-\\xff.json' is not UTF-8",
    "lock_is_a_folder": "inputs.lock: not a regular file",
    "smoke_expects_nothing": "the expected reply is empty",
    "smoke_skip_blank": "tp1.yaml:5: key 'smoke.skip' is empty: say why this profile's gate cannot run",
    "smoke_skip_too_long": "tp1.yaml:5: key 'smoke.skip' must be one line of at most 300 characters",
    "string_lone_surrogate": "tp1.yaml:4: a string holds a lone surrogate",
    "number_of_many_hex_digits": "tp1.yaml:2: a number too large to be a value",
    "number_of_many_digits": "tp1.yaml:2: a number too large to be a value",
    "aliases_expand_a_long_string": "characters once aliases are expanded",
    "mount_named_name": "would be MODEL_NAME in run.sh",
    "fragment_names_a_profile": "shared/nccl.yaml:1: a file in a subfolder of the profiles folder is a fragment",
    "profile_in_a_subfolder": "profiles/sub/tp5.yaml:1: a file in a subfolder of the profiles folder is a fragment "
                              "that profiles extend, not a profile: remove 'profile', or move the file to the top of "
                              "the profiles folder to make it a profile",
    "fragment_nothing_extends_does_not_parse": "profiles/shared/broken.yaml:2: YAML syntax error",
    "kernel_output_listed_twice": "output 'libk.so' of kernel 'k' is listed twice; list each library once",
    "kernel_outputs_empty": "product.yaml:13: kernel 'k' lists no outputs; name the libraries it gives",
    "port_written_as_another_number": "tp1.yaml:3: --port 8000 of profile 'tp1' is not launch.port 30000",
    "port_written_with_a_sign": "tp1.yaml:3: key 'args[1]' gives --port the value '+8000', which an engine reads as "
                                "a number",
    "port_in_full_width_digits": "tp1.yaml:3: key 'args[0]' gives --port the value '\uff18\uff10\uff10\uff10'",
    "port_option_cut_short": "tp1.yaml:3: key 'args[0]' is --por, which an engine's argument parser (Python's "
                             "argparse) takes for --port when no other option of the engine begins so; write the "
                             "option in full",
    "tensor_parallel_with_a_space": "tp1.yaml:3: key 'args[1]' gives --tp the value ' 4'",
    "tensor_parallel_option_cut_short": "tp1.yaml:3: key 'args[0]' is --t, which an engine's argument parser",
    "patch_writes_into_the_git_folder": "images/x.patch: patches .git/hooks/x, a file inside a .git folder, which is "
                                        "never baked",
    "patch_writes_a_pycache_file": "images/x.patch: patches lib/__pycache__/x.pyc, a file inside a __pycache__ folder",
    "overlay_into_the_git_folder": "product.yaml:13: the overlay's target .git/hooks/pre-commit is inside a .git folder",
    "yaml_standard_tag_on_a_value": "tp1.yaml:2: the YAML tag '!!int' is not supported",
    "yaml_str_tag_on_a_value": "tp1.yaml:4: the YAML tag '!!str' is not supported",
    "kernel_build_runs_nothing": "product.yaml:13: kernel 'k' is built by a command that runs nothing (its build.run "
                                 "is empty)",
    "base_of_a_platform_by_tag": "or as base.platforms.linux/arm64: sha256:<image ID> (a local image; base.id pins "
                                 "base.image only)",
    "profile_file_is_a_symlink_loop": "profiles/tp3.yaml: a symlink loop; point it at a file",
    "profile_file_points_nowhere": "profiles/tp3.yaml: a symlink that points nowhere",
    "extends_a_symlink_loop": "tp2.yaml:2: '.base.yaml' is a symlink loop",
    "product_yaml_linked_into_a_subfolder": "product.yaml: a symlink (to ",
    "profile_file_linked_to_product_yaml": "profiles/product.yaml, so the same file twice",
    "profile_file_linked_to_another": "/profiles/tp1.yaml, so the same file twice",
    "profile_file_linked_to_a_file_that_is_no_profile": "profiles/tp8.yaml: a symlink (to ",
    "overlay_target_name_too_long": "key 'overlays[0].target' names a file or folder of 303 bytes",
    "mount_path_name_too_long": "key 'launch.mounts.target' names a file or folder of 256 bytes",
    "number_yaml_reads_as_another": "key 'gpus' is written '010', which YAML reads as the number 8",
    "profile_named_like_another_for_a_platform": "'tp1-arm64' cannot name a profile",
    "lock_links_outside": "inputs.lock: a symlink that points outside the profiles folder",
    "overlay_nested_too_deeply": "source 'images/overlays/deep' is nested too deeply",
    "attachment_name_too_long": "is 251 bytes; at most 250",
    "profiles_past_the_engines_line_limit": "the engine refuses lines of 65535 bytes or more",
    "symlink_loop_in_a_source": "profiles/product.yaml:9: 'images/engine/loop' is a symlink loop",
    "symlink_loop_of_two_links": "'images/engine/a' is a symlink loop",
    "source_folder_is_a_symlink_loop": "profiles/tp1.yaml:3: 'images/tune/tp1' is a symlink loop",
    "symlink_pointing_nowhere": "profiles/product.yaml:9: 'images/engine/dangling' is a symlink that points nowhere",
    "lock_is_a_symlink_loop": "profiles/inputs.lock: a symlink loop",
    "yaml_tag_on_a_mapping": "tp1.yaml:4: the YAML tag '!!python/object:os.system' is not supported",
    "yaml_tag_on_a_list": "tp1.yaml:3: the YAML tag '!!python/object/apply:os.system' is not supported",
    "yaml_tag_on_a_key": "tp1.yaml:2: the YAML tag '!!python/name:os.system' is not supported",
    "yaml_set": "tp1.yaml:4: the YAML tag '!!set' is not supported",
    "yaml_line_separator": "tp1.yaml:2: holds U+2028 (line separator), which YAML reads as a line break and editors "
                           "do not",
    "yaml_next_line_in_a_value": "tp1.yaml:4: holds U+0085 (next line), which YAML reads as a line break",
    "extends_chain_too_long": "c100.yaml: its 'extends' chain is more than 32 files long (",
    "yaml_special_character": "tp1.yaml:4: holds the character U+009B, which YAML does not allow in a file",
    "prebuilt_outside_is_a_symlink_loop": "self.so' is a symlink loop",
    "engine_program_not_executable": "product.yaml:10: engine.command[0] '/opt/unibake/engine/serve.sh' is not "
                                     "executable: images/engine/serve.sh is baked with mode 644; chmod +x it",
    "engine_program_misspelt": "product.yaml:10: engine.command[0] '/opt/unibake/engine/serv.sh' is no file of the "
                               "image's engine folder",
    "tune_cache_with_merge_conflict_markers": "images/tune/tp1/cache-1.json:2: tune cache of profile 'tp1' is not "
                                              "JSON (Expecting property name enclosed in double quotes, column 1)",
    "tune_cache_saved_empty": "images/tune/tp2/cache-3.json:1: tune cache of profile 'tp2' is not JSON (Expecting "
                              "value, column 1)",
    "tune_cache_in_a_subfolder_cut_short": "images/tune/tp1/old/cache-0.json:1: tune cache of profile 'tp1' is not "
                                           "JSON (Expecting ',' delimiter, column 19)",
    "tune_cache_nested_too_deep": "images/tune/tp1/cache-2.json: tune cache of profile 'tp1' nests its JSON too deep",
    "kernel_of_another_platform_only": "product.yaml:13: kernel 'quant' has no file for linux/amd64: its platforms "
                                       "names linux/arm64 only; add platforms.linux/amd64, or prebuilt:",
    "platforms_key_twice_by_variant": "product.yaml:5: linux/arm64 and linux/arm64/v8 are the same platform; keep one",
    "visible_devices_with_an_empty_item": "tp2.yaml:5: env CUDA_VISIBLE_DEVICES='0,,1' hides GPUs from the engine",
    "gpu_device_ordinal_past_the_profiles_gpus": "tp1.yaml:4: env GPU_DEVICE_ORDINAL=4 names GPU 4, but the container "
                                                 "of profile 'tp1' sees only its 1 GPU",
    "visible_devices_fewer_than_the_profiles_gpus": "tp2.yaml:5: env CUDA_VISIBLE_DEVICES=1 names 1 GPU, but profile "
                                                    "'tp2' needs 2",
    "model_name_empty": "product.yaml:12: key 'launch.model_name' is empty: it names the model the engine serves "
                        "and the smoke gate and clients ask for (MODEL_NAME); name it, or leave the key out (its "
                        "default is the product name, unibake-test)",
    "model_name_blank": "product.yaml:12: key 'launch.model_name' is blank",
    "mount_hides_a_system_folder": "product.yaml:12: mount 'target' at /usr/local would hide the image's "
                                   "/usr/local, its programs and libraries: the container would fail on the GPU "
                                   "machine (the smoke gate mounts no weights); mount weights elsewhere, like "
                                   "/models/target",
    "mount_inside_proc": "product.yaml:12: mount 'target' at /proc/models lies inside /proc, where the container "
                         "runtime cannot mount it (runc: 'cannot be mounted because it is inside /proc')",
    "tensor_parallel_past_the_profiles_gpus": "tp1.yaml:3: --tensor-parallel-size 4 of profile 'tp1' starts the "
                                              "engine on 4 GPUs, but the profile has 1 (gpus: 1)",
    "shm_size_without_a_unit": "tp2.yaml:7: shm_size '16' is 16 bytes (docker reads a size without a unit as bytes)",
    "infiniband_device_without_rdma": "tp2.yaml:7: devices.extra names /dev/infiniband, but RDMA needs more locked "
                                      "memory than docker's default limit allows: set topology.rdma: true",
    "tune_cache_with_nan": "images/tune/tp1/cache-2.json:2: tune cache of profile 'tp1' holds NaN, which is not JSON",
    "tune_cache_with_infinity": "images/tune/tp2/cache-3.json:3: tune cache of profile 'tp2' holds -Infinity, which is "
                                "not JSON",
    "tune_cache_with_a_number_too_large": "images/tune/tp1/cache-2.json: tune cache of profile 'tp1' holds 1e999999, a "
                                          "number too large for a double",
    "patch_with_crlf_line_ends": "the patched path 'handle.sh\\r' ends in a carriage return: the patch's lines end "
                                 "in \\r\\n (a Windows editor's); save it with \\n line ends",
    "patch_makes_a_folder_path": "images/x.patch: the patched path 'newdir/' is not the relative path of a file",
    "fragment_that_is_a_symlink_to_a_profile": "profiles/shared/x.yaml is a symlink; extends names files and folders "
                                               "themselves",
    "fragment_linked_into_another_subfolder": "profiles/frag/y.yaml); a fragment must be the file itself",
    "extends_through_a_linked_folder": "profiles/sh2 is a symlink; extends names files and folders themselves",
    "key_of_topology_at_the_top": "unknown key 'nodes'; it belongs under topology.nodes",
    "tune_cache_with_a_key_twice": "images/tune/tp1/cache-2.json: tune cache of profile 'tp1' sets the key "
                                   "\"num_warps\" twice in one object",
    "tune_cache_with_a_byte_order_mark": "images/tune/tp1/cache-2.json: tune cache of profile 'tp1' starts with a "
                                         "UTF-8 byte-order mark, which json.load of the opened file refuses",
    "tune_cache_saved_as_utf16": "images/tune/tp2/cache-1.json: tune cache of profile 'tp2' is not JSON (not UTF-8: "
                                 "invalid start byte at byte 0); save it as UTF-8",
    "tune_cache_with_an_integer_of_5000_digits": "images/tune/tp1/cache-2.json: tune cache of profile 'tp1' holds an "
                                                 "integer of 5000 digits, more than Python's json reads (4300",
    "tune_cache_not_utf8": "images/tune/tp1/cache-2.json: tune cache of profile 'tp1' is not JSON (not UTF-8: invalid "
                           "start byte at byte 10)",
    "value_with_a_bidi_override": "tp1.yaml:4: key 'env.NCCL_ALGO' contains U+202E (RIGHT-TO-LEFT OVERRIDE), an "
                                  "invisible format character",
    "value_with_a_raw_bidi_isolate": "tp1.yaml:4: key 'env.NCCL_ALGO' contains U+2067 (RIGHT-TO-LEFT ISOLATE)",
    "value_with_a_zero_width_space": "key 'labels.com.example.team' contains U+200B (ZERO WIDTH SPACE)",
    "value_with_a_c1_control": "tp1.yaml:4: key 'env.NCCL_ALGO' contains a control character ('\\x9b')",
    "env_file_bidi_override": "images/tp1.env:1: the value of A contains U+202E (RIGHT-TO-LEFT OVERRIDE)",
    "file_name_with_a_bidi_override": "profiles/tp1.yaml:3: the file name 'images/tune/tp1/cache-\\u202enosj.json' "
                                      "holds U+202E (RIGHT-TO-LEFT OVERRIDE)",
    "context_file_of_8_gib": "profiles/product.yaml:9: 'images/engine/weights.bin' is 8589934592 bytes: a file of "
                             "8 GiB or more would get a pax size record in the reconstruct kit's context.tar",
    "hard_link_to_a_file_outside_the_project": "profiles/product.yaml:9: 'images/engine/key' is a hard link to a "
                                               "file outside the project (2 links, 1 of them under ",
    "key_of_a_megabyte": "tp1.yaml:7: a key of 1000000 characters ('aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa...'); "
                         "no key is longer than 128",
    "source_is_the_git_folder": "product.yaml:13: source '.git' is a .git folder, which is never baked",
    "source_inside_a_git_folder": "product.yaml:13: source 'images/engine/.git/config' is inside a .git folder",
    "check_that_runs_nothing": "product.yaml:13: check 'b' runs nothing (its run is blank), so it would pass every "
                               "self-check; give the command that checks, or remove the check",
    "check_named_twice": "product.yaml:13: check name 'a' is listed twice",
    "symlink_into_the_git_folder": "product.yaml:9: 'images/engine/vcs.conf' is a symlink into a .git folder (to ",
    "source_linked_to_the_git_folder": "product.yaml:13: 'images/vcs' is a symlink into a .git folder (to ",
    "bidi_override_in_a_comment": "tp1.yaml:2: holds U+202E (RIGHT-TO-LEFT OVERRIDE) outside any value (in a comment)",
    "env_file_bidi_override_in_a_comment": "images/tp1.env:1: holds U+2067 (RIGHT-TO-LEFT ISOLATE) in a comment",
    "yaml_lone_carriage_return": "product.yaml:5: holds a carriage return (\\r) not followed by a line feed",
    "engine_command_of_an_empty_program": "product.yaml:10: engine.command[0] is ' ': the first word is the program "
                                          "to run; name it",
    "env_file_c1_control": "images/tp1.env:1: the value of A contains a control character ('\\x9b')",
}

ARGUMENT_CASES = {
    "unknown-profile": ["--profile", "tp9"],
    "version-with-space": ["--version", "1.0 beta"],
    "version-with-dollar": ["--version", "1.$X"],
    "version-too-long": ["--version", "1" * 70],
    "split-too-small": ["--split", "10KB"],
    "split-not-a-size": ["--split", "lots"],
    "level-out-of-range": ["--level", "30"],
    "allow-not-a-regex": ["--allow", "("],
    "allow-empty": ["--allow", ""],  # an unset CI variable
    "allow-matching-everything": ["--allow", ".*"],
    "allow-matching-an-empty-value": ["--allow", "|hf_x"],
    "allow-that-could-backtrack-without-end": ["--allow", "^hf_([a-zA-Z0-9]+)+!$"],
    "sign-empty": ["--sign", ""],  # else an unsigned release, exit 0
    "sign-minisign-empty": ["--sign-minisign", ""],
    "version-ending-like-a-profile": ["--version", "1.0-tp1"],  # the tag of --profile tp1 --version 1.0
    "version-ending-like-a-platform": ["--version", "1.0-arm64"],
    "split-in-other-digits": ["--split", "\u0663GiB"],  # an Arabic-Indic three: Python's \\d takes it
    # found by review: a name too long for the file system passed the checks made before the work (a probe of a
    # short name), and failed at the end, "File name too long", exit 1
    "metadata-file-name-too-long": ["--metadata-file", "m" * 300],
    "out-name-too-long": ["--out", "o" * 300],
    "level-in-other-digits": ["--level", "\u0661\u0669"],  # int() took an Arabic-Indic 19, and '1_9', and ' 9 '
    "level-with-an-underscore": ["--level", "1_9"],
    "split-of-400-digits": ["--split", "9" * 400],  # float() made it infinity: an OverflowError's traceback
    "split-past-a-pib": ["--split", "2000000GiB"],
    "split-of-many-zeros-below-a-mib": ["--split", "0." + "0" * 30 + "1GiB"],
    # reached only at the round trip: refused there, after the build and the export, naming --engine
    "verify-engine-not-an-address": ["--verify-engine", "foo://x"],
    "verify-engine-port-out-of-range": ["--verify-engine", "tcp://host:99999"],
    # found by review: docker-py reads them as the local default engine, not the one a variable left unset named
    "engine-of-no-socket": ["--engine", "unix://"],
    "verify-engine-with-no-roundtrip": ["--verify-engine", "tcp://verify:2375", "--no-roundtrip"],  # none loaded there
    # first used at the round trip: refused there, exit 1, after the build and the export
    "scratch-dir-a-file": ["--scratch-dir", "/etc/passwd"],
    "scratch-dir-under-a-file": ["--scratch-dir", "/etc/passwd/scratch"],
    "scratch-dir-open-to-others": ["--scratch-dir", "/tmp"],
    # an option given twice: the first was dropped without a word (a CI line adding its own --out)
    "stage-given-twice": ["--stage", "render", "--stage", "render"],
    "out-given-twice": ["--out", "a", "--out", "b"],
    "version-given-twice": ["--version", "1.0", "--version=2.0"],
    # what a run stopping before the release would take and ignore: a split, a signature, a forced replace
    "split-with-stage-render": ["--stage", "render", "--split", "1900MiB"],
    "force-with-stage-render": ["--force", "--stage", "render"],
    "no-roundtrip-with-stage-render": ["--stage", "render", "--no-roundtrip"],
    "engine-with-stage-render": ["--stage", "render", "--engine", "unix:///run/docker.sock"],  # no engine reached
    "out-with-stage-render": ["--stage", "render", "--out", "dist"],  # nothing written there
    "out-that-takes-no-folder": ["--out", "/proc/unibake-release"],  # said at the release folder, exit 1 (root too)
    # --no-seed where no seeded engine is used: taken and ignored
    "no-seed-with-sequential": ["--no-seed", "--sequential"],
    "no-seed-with-no-roundtrip": ["--no-roundtrip", "--no-seed"],
    # --scratch-dir where no scratch engine is started: taken, unchecked, and ignored
    "scratch-dir-with-stage-build": ["--stage", "build", "--scratch-dir", "/var/tmp/unibake-scratch"],
    "scratch-dir-with-no-roundtrip": ["--no-roundtrip", "--scratch-dir", "/var/tmp/unibake-scratch"],
}


def assert_refused(result, product_root: Path):
    assert result.code == 2, result.err
    assert len(result.error_lines) == 1 and result.err.strip().splitlines()[-1] == result.error_lines[0]
    assert not (product_root / "dockerfiles").exists(), "something was rendered"
    assert not (product_root / "release").exists(), "a release folder was made"
    assert not (product_root / "checksums").exists()


def remove_deep(top: Path) -> None:
    """A folder tree removed without recursion: pytest's clean-up of old temporary folders (and
    shutil.rmtree) recurse, and a tree 1000 levels deep ends them in a RecursionError."""
    order, stack = [], [top]
    while stack:
        folder = stack.pop()
        order.append(folder)
        for entry in os.scandir(folder):
            if entry.is_dir(follow_symlinks=False):
                stack.append(Path(entry.path))
            else:
                os.unlink(entry.path)
    for folder in reversed(order):
        os.rmdir(folder)


@pytest.mark.parametrize("case", sorted(YAML_CASES))
def test_bad_yaml_and_inputs_are_refused_before_anything_happens(cli, busybox_product, case):
    YAML_CASES[case](busybox_product)
    result = cli("--config", str(busybox_product))
    if (busybox_product.parent / "images/overlays/deep").exists():
        remove_deep(busybox_product.parent / "images/overlays/deep")
    assert_refused(result, busybox_product.parent)
    assert SAYS.get(case, "") in result.error_lines[0]
    assert len(result.error_lines[0]) < 5000, result.error_lines[0][:300]
    assert "SECRET" not in result.err  # a file the lock links to is not read, so not quoted


@pytest.mark.parametrize("case", sorted(ARGUMENT_CASES))
def test_bad_arguments_are_refused_before_anything_happens(cli, busybox_product, case):
    assert_refused(cli("--config", str(busybox_product), *ARGUMENT_CASES[case]), busybox_product.parent)


@pytest.mark.parametrize("args", [["archive", "x:1", "--tag", "../up"], ["archive", "x:1", "--tag", "a b"],
                                  ["archive", "sha256:" + "0" * 64], ["archive", "x:1", "--product", "Bad Name"],
                                  # held to product.yaml's pattern (before: NAME_RE's, which takes two separators)
                                  ["archive", "x:1", "--product", "a..b"],
                                  ["archive", "sha256:" + "0" * 64, "--tag", "1.0", "--product", "a-.b"],
                                  ["archive", "x:1", "--product", "a" * 65],
                                  ["hotfix", "--version", "2"], ["verify", "/nonexistent/release"],
                                  # docker-py raises a bare ValueError for these addresses
                                  ["prune", "--dry-run", "--engine", "tcp://host:99999"],
                                  ["prune", "--dry-run", "--engine", "ssh://a:b:c"],
                                  ["prune", "--dry-run", "--engine", "http://[::1"]])
def test_bad_arguments_of_other_commands_exit_2_without_an_engine(cli, tmp_path, args):
    result = cli(*args, "--out", str(tmp_path / "out")) if args[0] == "archive" else cli(*args)
    assert result.code == 2, result.err
    assert len(result.error_lines) == 1
    assert not (tmp_path / "out").exists()


def test_hostile_values_are_refused_in_every_case_counted():
    """The figure docs/RELIABILITY.md quotes."""
    assert len(YAML_CASES) + len(ARGUMENT_CASES) >= 30


def test_nested_yaml_aliases_are_refused_quickly(cli, busybox_product):
    """A billion laughs in 1 KB: bounded, one error line, in well under a second's work."""
    import time

    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, "
              f"*a{i - 1}, *a{i - 1}, *a{i - 1}]" for i in range(1, 9)]
    text = "profile: tp9\ngpus: 1\nx: {" + ", ".join(f"k{i}: *a8" for i in range(3)) + "}\n"
    (busybox_product / "tp9.yaml").write_text("\n".join(lines) + "\n" + text)
    assert len((busybox_product / "tp9.yaml").read_bytes()) < 1500
    start = time.monotonic()
    result = cli("--stage", "render", "--config", str(busybox_product))
    # generous: the run is a whole CLI process (under coverage, on a shared machine); expanding the
    # 10**9 nodes would take hours and all the memory, so the bound still tells the two apart
    assert time.monotonic() - start < 60
    assert result.code == 2 and "nested aliases" in result.error_lines[0]


def test_pull_takes_a_temp_dir_and_refuses_one_that_is_not_a_folder(cli, tmp_path):
    from .test_publish import make_release

    folder = make_release(tmp_path / "release")[0]
    result = cli("pull", "registry.example:5000/demo-llm@sha256:" + "a" * 64, "--release", str(folder),
                 "--temp-dir", str(tmp_path / "nowhere"))
    assert result.code == 2 and result.error_lines == [f"error: --temp-dir {tmp_path / 'nowhere'}: not a folder"], \
        result.err


def test_one_profile_past_the_engines_line_limit_is_told_what_to_shorten_not_to_select_fewer(cli, busybox_product):
    prompts = ", ".join(f"{{prompt: 'Say {i} {'x' * 4000}', expect: UNIFIED_TP1_OK}}" for i in range(20))
    edit(busybox_product / "tp1.yaml", "smoke: {expect_reply: UNIFIED_TP1_OK, timeout: 20}",
         f"smoke: {{timeout: 20, prompts: [{prompts}]}}")
    result = cli("--config", str(busybox_product), "--profile", "tp1")
    assert_refused(result, busybox_product.parent)
    assert "the engine refuses lines of 65535 bytes or more: shorten profile tp1's smoke prompts and expected " \
           "replies, the largest part of it (" in result.error_lines[0]
    assert "--profile" not in result.error_lines[0]
