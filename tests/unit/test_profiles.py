"""Loading, validating and merging profile YAMLs: what a user sees when a file is wrong."""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unibake.errors import InputError
from unibake.plan import make_plan
from unibake.profiles import merge


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


# --- the merge rules ---------------------------------------------------------------------------


def test_merge_maps_key_by_key_child_wins_lists_replace_sidecars_merge_by_name():
    parent = {"env": {"A": "1", "B": "2"}, "args": ["--x"], "gpus": 1,
              "sidecars": [{"name": "a"}, {"name": "c", "version": "1"}],
              "smoke": {"expect_reply": "P", "timeout": 5},
              "profile": "base", "extends": "product.yaml"}
    child = {"env": {"B": "3", "C": "4"}, "args": ["--y"], "gpus": 2,
             "sidecars": [{"name": "b"}, {"name": "c", "version": "2"}],
             "smoke": {"expect_reply": "C"}, "profile": "child"}
    merged = merge(parent, child)
    assert merged["env"] == {"A": "1", "B": "3", "C": "4"}
    assert merged["args"] == ["--y"]
    assert merged["gpus"] == 2
    assert merged["sidecars"] == [{"name": "a"}, {"name": "c", "version": "2"}, {"name": "b"}]
    assert merged["smoke"] == {"expect_reply": "C", "timeout": 5}
    assert merged["profile"] == "child"
    assert "extends" not in merged


def test_merge_is_pure():
    parent = {"env": {"A": "1"}, "sidecars": [{"name": "a"}]}
    child = {"env": {"B": "2"}, "sidecars": [{"name": "a", "version": "2"}]}
    merge(parent, child)
    assert parent == {"env": {"A": "1"}, "sidecars": [{"name": "a"}]}
    assert child == {"env": {"B": "2"}, "sidecars": [{"name": "a", "version": "2"}]}


def test_a_profile_inherits_from_a_profile_it_extends(busybox_product):
    plan = make_plan(busybox_product)
    tp2 = plan.profile("tp2")
    assert tp2.smoke.timeout == 20  # from tp1.yaml, which tp2.yaml extends
    assert tp2.env == {"SHARED_SETTING": "on", "NCCL_ALGO": "Ring"}
    assert plan.env_common == {"SHARED_SETTING": "on"}



def test_a_single_node_profile_may_set_master_port_in_its_env(busybox_product):
    # only several nodes take it from topology: (run.sh's -e); alone, the profile's env is what the engine sees
    tp1 = busybox_product / "tp1.yaml"
    tp1.write_text(tp1.read_text().replace("env: {NCCL_ALGO: Tree}", "env: {NCCL_ALGO: Tree, MASTER_PORT: '29501'}"))
    assert make_plan(busybox_product, verify_lock=False).profile("tp1").env["MASTER_PORT"] == "29501"

# --- bad files ------------------------------------------------------------------------------------


def test_unknown_key_names_file_line_and_closest_key(busybox_product):
    write(busybox_product / "tp1.yaml", "profile: tp1\ngpus: 1\ntune_cache: {source: images/tune/tp1}\n")
    with pytest.raises(InputError, match=r"tp1\.yaml:3: unknown key 'tune_cache'; did you mean 'tune_caches'\?"):
        make_plan(busybox_product)


def test_unknown_nested_key_is_named_with_its_path(busybox_product):
    write(busybox_product / "tp1.yaml",
          "profile: tp1\ngpus: 1\ntune_caches:\n  source: images/tune/tp1\n  expected: 2\n")
    with pytest.raises(InputError, match=r"tp1\.yaml:5: unknown key 'tune_caches.expected'; did you mean 'expect'"):
        make_plan(busybox_product)


def test_wrong_type_is_refused_with_a_hint(busybox_product):
    product = busybox_product / "product.yaml"
    write(product, product.read_text().replace("version: 0.1.0", "version: 1.10"))
    with pytest.raises(InputError, match=r"product\.yaml:3: key 'version' must be a string, not float; "
                                         r"put it in quotes, or YAML reads it as the number 1\.1$"):
        make_plan(busybox_product)


@pytest.mark.parametrize("written,words", [("on", "true, yes or on"), ("no", "false, no or off")])
def test_a_value_yaml_reads_as_a_boolean_is_refused_with_the_hint_to_quote_it(busybox_product, written, words):
    # env: {SHARED_SETTING: on} said "must be a string, not bool" and no more: 'on' is a string to its writer
    product = busybox_product / "product.yaml"
    write(product, product.read_text().replace('SHARED_SETTING: "on"', f"SHARED_SETTING: {written}"))
    with pytest.raises(InputError, match=rf"product\.yaml:\d+: key 'env\.SHARED_SETTING' must be a string, not bool; "
                                         rf"put it in quotes: YAML reads an unquoted {words} as a boolean$"):
        make_plan(busybox_product)


@pytest.mark.parametrize("written,read", [("010", 8), ("1:30", 90), ("0x10", 16), ("1_0", 10)])
def test_a_number_yaml_reads_as_another_is_refused(busybox_product, written, read):
    # YAML 1.1: a leading zero is octal, a colon base 60; gpus: 010 gave an image of 8 GPUs
    tp1 = busybox_product / "tp1.yaml"
    write(tp1, tp1.read_text().replace("gpus: 1", f"gpus: {written}"))
    with pytest.raises(InputError, match=rf"tp1\.yaml:\d+: key 'gpus' is written '[^']+', which YAML reads as the "
                                         rf"number {read}; write {read} in plain decimal digits, or quote it"):
        make_plan(busybox_product, verify_lock=False)


@pytest.mark.parametrize("old,new,tag", [
    ("gpus: 1", 'gpus: !!int "1"', "!!int"), ("gpus: 1", "gpus: !!int '07'", "!!int"), ("gpus: 1", "gpus: ! 1", "!"),
    ("env: {NCCL_ALGO: Tree}", "env: {NCCL_ALGO: !!str Tree}", "!!str"),
    ("env: {NCCL_ALGO: Tree}", "env: !!map {NCCL_ALGO: Tree}", "!!map"),
    ("gpus: 1", "!!str gpus: 1", "!!str")])
def test_any_yaml_tag_written_is_refused_the_standard_ones_too(busybox_product, old, new, tag):
    # the README: no tags. A standard tag on a value (gpus: !!int "1") was read as the value it makes, while
    # !!set or !!python/... on a mapping was refused: a node keeps only its resolved tag, so it is refused as read
    tp1 = busybox_product / "tp1.yaml"
    write(tp1, tp1.read_text().replace(old, new))
    with pytest.raises(InputError, match=rf"tp1\.yaml:\d+: the YAML tag '{re.escape(tag)}' is not supported; a profile "
                                         r"holds plain mappings, lists, strings, numbers and true/false: remove the "
                                         r"tag$"):
        make_plan(busybox_product, verify_lock=False)


def test_a_file_of_more_values_than_the_limit_is_refused_quickly_without_blaming_aliases(busybox_product):
    # a map of 200,000 keys and no alias said 'more than 100000 values once aliases are expanded (nested
    # aliases?)', after PyYAML's pure-Python composer had read it whole (about 25 s for the CLI, which reads it twice)
    import time

    tp1 = busybox_product / "tp1.yaml"
    write(tp1, tp1.read_text().replace("env: {NCCL_ALGO: Tree}",
                                       "env:\n" + "".join(f"  K{i}: v\n" for i in range(200_000))))
    start = time.monotonic()
    with pytest.raises(InputError, match=r"tp1\.yaml:\d+: more than 100000 values; a profile holds hundreds$"):
        make_plan(busybox_product, verify_lock=False)
    assert time.monotonic() - start < 5  # (about 0.2 s: libyaml's parser counts them first)


def test_values_past_the_limit_are_counted_as_read_without_libyaml_too(busybox_product, monkeypatch):
    # 110,000 values and few keys: under the twice-the-limit nodes libyaml's count refuses, so the composer's own
    # count (the only one without libyaml) refuses them as it reads, with the same words
    import yaml

    monkeypatch.setattr(yaml, "__with_libyaml__", False)
    tp1 = busybox_product / "tp1.yaml"
    write(tp1, tp1.read_text() + "x:\n" + "  - [v, v, v, v, v, v, v, v, v, v]\n" * 10_000)
    with pytest.raises(InputError, match=r"tp1\.yaml:\d+: more than 100000 values; a profile holds hundreds$"):
        make_plan(busybox_product, verify_lock=False)


def test_missing_required_key_is_named(busybox_product):
    write(busybox_product / "tp1.yaml", "profile: tp1\ntune_caches: {source: images/tune/tp1, expect: 2}\n")
    with pytest.raises(InputError, match=r"tp1\.yaml: required key 'gpus' is missing"):
        make_plan(busybox_product)


def test_missing_product_key_points_at_product_yaml(busybox_product):
    product = busybox_product / "product.yaml"
    write(product, product.read_text().replace("product: unibake-test\n", ""))
    with pytest.raises(InputError, match=r"product\.yaml: required key 'product' is missing"):
        make_plan(busybox_product)


def test_yaml_syntax_error_names_the_line(busybox_product):
    write(busybox_product / "tp2.yaml", "profile: tp2\ngpus: 2\nenv: {A: [1, 2}\n")
    with pytest.raises(InputError, match=r"tp2\.yaml:3: YAML syntax error"):
        make_plan(busybox_product)


@pytest.mark.parametrize("text, says", [
    # PyYAML's problem alone was "second occurrence" and "but found another document": its context is the subject
    ("profile: tp3\ngpus: &n 3\nenv: &n {A: b}\n",
     "tp3.yaml:3: YAML syntax error: found duplicate anchor 'n'; first occurrence (line 2), second occurrence"),
    ("profile: tp3\ngpus: 3\n---\nprofile: tp4\n",
     "tp3.yaml:3: YAML syntax error: expected a single document in the stream (line 1), but found another document"),
    ("profile: tp3\ngpus: 3\nargs: [a,\n  b\n",
     "tp3.yaml:5: YAML syntax error: expected ',' or ']', but got '<stream end>' (while parsing a flow sequence "
     "that began on line 3)"),
])
def test_a_yaml_syntax_error_says_what_pyyaml_found_not_only_its_last_words(busybox_product, text, says):
    write(busybox_product / "tp3.yaml", text)
    with pytest.raises(InputError) as raised:
        make_plan(busybox_product)
    assert str(raised.value).endswith(says), str(raised.value)


def test_duplicate_key_in_one_file_is_refused(busybox_product):
    write(busybox_product / "tp2.yaml", "profile: tp2\ngpus: 2\ngpus: 4\n")
    with pytest.raises(InputError, match=r"tp2\.yaml:3: key 'gpus' appears twice"):
        make_plan(busybox_product)


def test_profiles_share_keys_through_a_fragment_in_a_subfolder(busybox_product):
    # a fragment names no parent and extends product.yaml, as a profile does (before: it had to name
    # '../product.yaml', refused as a path, and 'profile:' was required of it)
    write(busybox_product / "shared" / "ring.yaml", "env: {NCCL_ALGO: Ring, FRAGMENT: 'yes'}\nsmoke: {timeout: 33}\n")
    write(busybox_product / "tp2.yaml", "profile: tp2\nextends: shared/ring.yaml\ngpus: 2\n")
    plan = make_plan(busybox_product)
    tp2 = plan.profile("tp2")
    assert tp2.env == {"SHARED_SETTING": "on", "NCCL_ALGO": "Ring", "FRAGMENT": "yes"}
    assert tp2.smoke.timeout == 33
    assert sorted(plan.known_profiles) == ["tp1", "tp2"]  # the fragment is no profile
    assert any(f.endswith("profiles/shared/ring.yaml") for f in plan.config_files)  # kit and provenance carry it


def test_a_fragment_that_spells_out_extends_product_yaml_extends_the_product_file(busybox_product):
    # the README: a fragment "extends product.yaml unless it names a file beside it"; written out, `extends:
    # product.yaml` was refused as "names 'product.yaml', which does not exist" (it looked in shared/)
    write(busybox_product / "shared" / "ring.yaml", "extends: product.yaml\nenv: {NCCL_ALGO: Ring}\n")
    write(busybox_product / "tp2.yaml", "profile: tp2\nextends: shared/ring.yaml\ngpus: 2\n")
    assert make_plan(busybox_product).profile("tp2").env == {"SHARED_SETTING": "on", "NCCL_ALGO": "Ring"}
    # another name is still looked for beside the fragment, and the error says where it looked
    write(busybox_product / "shared" / "ring.yaml", "extends: tp1.yaml\nenv: {NCCL_ALGO: Ring}\n")
    with pytest.raises(InputError, match=r"ring\.yaml:1: 'extends' names 'tp1\.yaml', which does not exist beside "
                                         r"ring\.yaml \(a named parent lies beside the file that names it\)$"):
        make_plan(busybox_product)


@pytest.mark.parametrize("key, value, says", [
    ("extends", "./tp1.yaml", "expected a .yaml file beside this one or in a subfolder of its folder, like tp2.yaml"),
    ("extends", "/abs/tp1.yaml", "(no spaces, no '.' or '..' parts, not absolute)"),
    ("sidecars", "[{name: x, version: '1', source: images/k, outputs: [./libx.so]}]",
     "expected a path inside the kernel's folder like lib/libfoo.so"),
    ("sidecars", "[{name: x, version: '1', source: ./images/k}]", "(no spaces, no '.' or '..' parts)"),
])
def test_a_path_refused_by_its_pattern_is_explained_as_what_that_key_takes(busybox_product, key, value, says):
    # './tp2.yaml' in extends was "expected a relative path inside the repository ... (no '..')": it is one, and
    # has no '..'; an output path was said to be one "inside the repository", where it is one of the kernel's folder
    write(busybox_product / "tp2.yaml", f"profile: tp2\ngpus: 2\n{key}: {value}\n")
    with pytest.raises(InputError) as raised:
        make_plan(busybox_product)
    assert says in str(raised.value), str(raised.value)


def test_a_fragment_that_names_a_profile_is_refused(busybox_product):
    write(busybox_product / "shared" / "ring.yaml", "profile: ring\nenv: {NCCL_ALGO: Ring}\n")
    write(busybox_product / "tp2.yaml", "profile: tp2\nextends: shared/ring.yaml\ngpus: 2\n")
    with pytest.raises(InputError, match=r"shared/ring\.yaml:1: a file in a subfolder of the profiles folder is a "
                                         r"fragment that profiles extend, not a profile: remove 'profile'"):
        make_plan(busybox_product)


def test_every_yaml_file_in_a_subfolder_is_read_as_a_fragment_whether_a_profile_extends_it_or_not(busybox_product):
    # the README: a fragment "is no profile (it sets no profile:; one that does is refused)". One that nothing
    # extends was never read: a profile put in a subfolder was left out without a word (the image had one profile
    # fewer than the folder showed, and --profile NAME said unknown), and one that did not parse was never refused
    write(busybox_product / "shared" / "amd" / "rocm.yaml", "devices: {vendor: amd}\n")  # nothing extends it: fine
    write(busybox_product / ".hidden" / "notes.yaml", "not: [a fragment\n")  # an editor's or a tool's: not read
    plan = make_plan(busybox_product)
    assert sorted(plan.known_profiles) == ["tp1", "tp2"]
    assert not any("rocm.yaml" in f for f in plan.config_files)  # the kit carries what a profile extends only
    tp1 = (busybox_product / "tp1.yaml").read_text()
    write(busybox_product / "sub" / "tp5.yaml", tp1.replace("profile: tp1", "profile: tp5"))
    with pytest.raises(InputError, match=r"sub/tp5\.yaml:1: a file in a subfolder of the profiles folder is a fragment "
                                         r"that profiles extend, not a profile: remove 'profile', or move the file to "
                                         r"the top of the profiles folder to make it a profile$"):
        make_plan(busybox_product)
    (busybox_product / "sub" / "tp5.yaml").unlink()
    write(busybox_product / "shared" / "amd" / "broken.yml", "env: {A: [1\n")
    with pytest.raises(InputError, match=r"shared/amd/broken\.yml:2: YAML syntax error"):
        make_plan(busybox_product)
    (busybox_product / "shared" / "amd" / "broken.yml").unlink()
    write(busybox_product / "shared" / "ring.YAML", "env: {NCCL_ALGO: Ring}\n")
    with pytest.raises(InputError, match=r"shared/ring\.YAML: fragments end in \.yaml \(or \.yml\), in lower case"):
        make_plan(busybox_product)


def test_extends_cycle_is_refused(busybox_product):
    write(busybox_product / "tp1.yaml", "profile: tp1\nextends: tp2.yaml\ngpus: 1\n")
    with pytest.raises(InputError, match=r"'extends' forms a cycle: .*tp1\.yaml -> .*tp2\.yaml -> .*tp1\.yaml"):
        make_plan(busybox_product)


def test_missing_parent_is_refused(busybox_product):
    write(busybox_product / "tp2.yaml", "profile: tp2\nextends: tp9.yaml\ngpus: 2\n")
    with pytest.raises(InputError, match=r"tp2\.yaml:2: 'extends' names 'tp9\.yaml', which does not exist"):
        make_plan(busybox_product)


def test_duplicate_profile_names_are_refused(busybox_product):
    write(busybox_product / "tp3.yaml", "profile: tp2\ngpus: 3\n")
    with pytest.raises(InputError, match=r"tp3\.yaml:1: profile 'tp2' is also defined in .*tp2\.yaml"):
        make_plan(busybox_product)


@pytest.mark.parametrize("old,new,says", [
    ('  image: "localhost/unibake-demo-base:bookworm"', "  image: kernels", "the base image 'kernels'"),
    ("    build:\n", "    build:\n      image: kernels\n", "the toolchain image 'kernels'")])
def test_an_image_named_like_a_builder_stage_above_its_from_is_refused(demo_product, old, new, says):
    # FROM kernels takes the stage "kernels" (the compiler image) before an image of that name: the release
    # was built on the builder stage, silently
    product = demo_product / "product.yaml"
    assert old in product.read_text()
    write(product, product.read_text().replace(old, new, 1))
    with pytest.raises(InputError, match=rf"product\.yaml:\d+: {says} has the name of a builder stage of the "
                                         r"Dockerfile above its FROM line.*\(kernels:latest\)"):
        make_plan(demo_product, cwd=demo_product.parent, verify_lock=False)
    # the first FROM has no stage above it, and a tag is never a stage's name
    write(product, product.read_text().replace(new, old.replace("localhost/unibake-demo-base:bookworm", "kernels:1")))
    make_plan(demo_product, cwd=demo_product.parent, verify_lock=False)


@pytest.mark.parametrize("member", ["lib/a:b.so", "lib/lib*.so"])
def test_a_prebuilt_library_the_image_cannot_list_by_its_path_is_refused(busybox_product, member):
    # every library of an archive is loaded by default, by its path in ':'-separated lists the shell splits
    # (UNIBAKE_KERNELS, LD_LIBRARY_PATH; self-check expands them unquoted): 'a:b.so' became '.../a' and 'b.so',
    # and self-check failed after the build
    import io
    import tarfile

    from .test_real_stacks import elf

    archive = busybox_product.parent / "images" / "odd.tar"
    with tarfile.open(archive, "w") as tar:
        for name in (member, "lib/libok.so"):
            info = tarfile.TarInfo(name)
            info.size = len(elf())
            tar.addfile(info, io.BytesIO(elf()))
    product = busybox_product / "product.yaml"
    write(product, product.read_text() + 'kernels: [{name: odd, version: "1", prebuilt: images/odd.tar}]\n')
    with pytest.raises(InputError, match=rf"product\.yaml:\d+: images/odd\.tar holds the library "
                                         rf"'{re.escape(member)}', which the image's ':'-separated library lists"):
        make_plan(busybox_product, verify_lock=False)
    write(product, product.read_text().replace("prebuilt: images/odd.tar}", "prebuilt: images/odd.tar, "
                                               "outputs: [lib/libok.so]}"))
    assert make_plan(busybox_product, verify_lock=False).kernels[0].outputs == ("lib/libok.so",)


def test_shared_key_in_a_profile_file_is_refused(busybox_product):
    write(busybox_product / "tp2.yaml", "profile: tp2\ngpus: 2\nbase: {image: other}\n")
    with pytest.raises(InputError, match=r"tp2\.yaml:3: key 'base' can only be set in product\.yaml"):
        make_plan(busybox_product)


def test_unknown_default_profile_is_refused(busybox_product):
    product = busybox_product / "product.yaml"
    write(product, product.read_text().replace("default_profile: tp1", "default_profile: tp8"))
    with pytest.raises(InputError, match=r"default_profile 'tp8' is not a profile; known: tp1, tp2"):
        make_plan(busybox_product)


@pytest.mark.parametrize("name", ["unibake.-test", "unibake..test", "unibake__test", "unibake-_test", "unibake--test"])
def test_a_product_name_no_image_repository_can_have_is_refused_at_the_plan(busybox_product, name):
    # lower-case letters, digits, '.', '_' and '-' all, but two separators in a row: it passed the
    # schema and ended in a traceback when the image's metadata was made from the tag
    product = busybox_product / "product.yaml"
    write(product, product.read_text().replace("product: unibake-test", f"product: {name}"))
    with pytest.raises(InputError, match=rf"product\.yaml:\d+: key 'product' has an invalid value '{re.escape(name)}': "
                                         r"expected lower-case letters and digits, with one '\.', '_' or '-' between"):
        make_plan(busybox_product, verify_lock=False)


def test_tune_cache_count_mismatch_is_refused_before_building(busybox_product):
    (busybox_product.parent / "images/tune/tp2/cache-3.json").unlink()
    with pytest.raises(InputError, match=r"profile 'tp2' expects 3 tune-cache JSON files in "
                                         r"'images/tune/tp2', found 2"):
        make_plan(busybox_product, verify_lock=False)


def test_a_tune_cache_count_that_counted_a_subfolder_says_only_the_top_level_counts(busybox_product):
    # a cache folder with nested JSON (a gemm/ subfolder): all three are baked, one is at the top; the
    # message said "found 1" of a folder holding three, and nothing about why
    tune = busybox_product.parent / "images/tune/tp2"
    (tune / "gemm/nested").mkdir(parents=True)
    (tune / "cache-2.json").rename(tune / "gemm/cache-2.json")
    (tune / "cache-3.json").rename(tune / "gemm/nested/cache-3.json")
    with pytest.raises(InputError, match=r"profile 'tp2' expects 3 tune-cache JSON files in 'images/tune/tp2', "
                                         r"found 1 at its top level \(2 more in its subfolders are baked but not "
                                         r"counted: expect counts the top level only\)$"):
        make_plan(busybox_product, verify_lock=False)


@pytest.mark.parametrize("field,value,message", [
    ("env", '{A: "x\\ny"}', r"key 'env.A' contains a control character"),
    ("env", '{A: "x\\u0000y"}', r"key 'env.A' contains a control character"),
    ("env", '{"A B": x}', r"key 'A B' in 'env' is not valid"),
    ("env", "{A: " + "x" * 5000 + "}", r"key 'env.A' is 5000 characters long"),
    ("args", '["--a\\rb"]', r"key 'args\[0\]' contains a control character"),
    # a block scalar: the message says how YAML writes it on one line (before: only that newlines are refused)
    ("smoke", "\n  expect_reply: >\n    UNIFIED_TP2_OK\n", r"key 'smoke.expect_reply' contains a control character "
                                                         r"\('\\n'\); .*: write '>-' or '\|-'$"),
    ("args", "\n  - |\n    --a\n    --b\n", r"key 'args\[0\]' contains .*; a YAML '>-' block folds its lines into one"),
])
def test_hostile_values_are_refused(busybox_product, field, value, message):
    write(busybox_product / "tp2.yaml", f"profile: tp2\ngpus: 2\n{field}: {value}\n")
    with pytest.raises(InputError, match=message):
        make_plan(busybox_product, verify_lock=False)


@pytest.mark.parametrize("version", ["1.0\n", "1.0; rm", "../1", "v1 0", "-1", "1.0\"", "x" * 65])
def test_invalid_versions_are_refused(busybox_product, version):
    with pytest.raises(InputError, match=r"--version .* is not a valid version"):
        make_plan(busybox_product, version=version)


def test_a_version_too_long_says_its_limit(busybox_product):
    # A valid Docker tag of 65 characters: the message must name the length, not only the characters.
    with pytest.raises(InputError, match=r"--version .* is not a valid version: .*at most 64 characters"):
        make_plan(busybox_product, version="1" + "a" * 64)
    product = busybox_product / "product.yaml"
    write(product, re.sub(r"(?m)^version: .*$", "version: v" + "1" * 64, product.read_text()))
    with pytest.raises(InputError, match=r"key 'version' has an invalid value .*at most 64 characters"):
        make_plan(busybox_product, verify_lock=False)


@pytest.mark.parametrize("label", ['{"Bad Key": x}', '{"a\\nb": x}'])
def test_invalid_label_keys_are_refused(busybox_product, label):
    product = busybox_product / "product.yaml"
    write(product, product.read_text() + f"labels: {label}\n")
    with pytest.raises(InputError, match=r"in 'labels' is not valid"):
        make_plan(busybox_product, verify_lock=False)


def test_base_by_tag_is_refused_when_a_digest_is_required(busybox_product):
    product = busybox_product / "product.yaml"
    write(product, product.read_text().replace('base: {image: "localhost/unibake-busybox:1"}',
                                               'base: {image: "localhost/unibake-busybox:1", require_digest: true}'))
    with pytest.raises(InputError, match=r"base\.image .* is given by tag, but base\.require_digest is set"):
        make_plan(busybox_product, verify_lock=False)


def _same_suffix_every_way(selected: list[str], known: list[str]) -> list[str] | None:
    """The check as it was, trying every way to spell the selection (exponential): the reference."""
    parts = "-".join(selected).split("-")

    def walk(start, chosen):
        if start == len(parts):
            return chosen if chosen not in (selected, known) else None
        for end in range(start + 1, len(parts) + 1):
            name = "-".join(parts[start:end])
            if name in known and (not chosen or name > chosen[-1]):
                found = walk(end, [*chosen, name])
                if found is not None:
                    return found
        return None
    return walk(0, [])


@settings(max_examples=300, deadline=None)
@given(st.sets(st.lists(st.sampled_from("ab"), min_size=1, max_size=3).map("-".join), min_size=1, max_size=7),
       st.data())
def test_the_tag_check_finds_another_spelling_exactly_when_trying_every_way_does(names, data):
    from unibake.plan import _same_suffix

    known = sorted(names)
    selected = sorted(data.draw(st.sets(st.sampled_from(known), min_size=1)))
    found, reference = _same_suffix(selected, known), _same_suffix_every_way(selected, known)
    assert (found is None) == (reference is None)
    if found is not None:  # another sorted selection of known names, spelling the same suffix
        assert found not in (selected, known) and found == sorted(set(found)) and set(found) <= names
        assert "-".join(found) == "-".join(selected)


def test_the_tag_check_of_many_profiles_named_alike_is_quick():
    # found by review: profiles a, a-a, a-a-a, ... every one but a selected: 20 of them took 75 s, each one more
    # 2.3 times as long (every way to spell the suffix was tried)
    from unibake.plan import _same_suffix

    known = sorted("-".join(["a"] * n) for n in range(1, 41))
    outcome = []
    worker = threading.Thread(target=lambda: outcome.append([_same_suffix(known[1:], known),
                                                             _same_suffix(known[1:-2] + known[-1:], known)]),
                              daemon=True)
    worker.start()
    worker.join(20)
    assert outcome, "still trying after 20 s"
    # every one but a: no other spelling (the lengths 2..40 alone add up to 819); every one but a, and the
    # names of 38 and 39 parts: the 1 + 37 + 38 parts of a, then the names of 37 and 38 parts, spell it too
    none, other = outcome[0]
    assert none is None
    assert other is not None and "-".join(other) == "-".join(known[1:-2] + known[-1:]) and other[0] == "a"

def test_a_bare_equals_sign_is_the_text_it_reads_as_not_a_yaml_error(busybox_product):
    # found by review: PyYAML resolves a plain "=" to YAML 1.1's value tag, which it cannot construct: a valid
    # file was "YAML syntax error: could not determine a constructor for the tag 'tag:yaml.org,2002:value'"
    tp1 = busybox_product / "tp1.yaml"
    tp1.write_text(tp1.read_text().replace("env: {NCCL_ALGO: Tree}", "env: {NCCL_ALGO: Tree, SEP: =}"))
    assert make_plan(busybox_product, verify_lock=False).profile("tp1").env["SEP"] == "="

@pytest.mark.skipif(os.geteuid() != 0, reason="makes a folder another user cannot read, as root can")
def test_a_subfolder_of_the_profiles_folder_this_user_cannot_read_is_named_not_skipped():
    # os.walk skipped it without a word: the fragments in it went unchecked
    import shutil
    import tempfile

    from ..conftest import BUSYBOX_PRODUCT, as_nobody, copy_product

    shared = Path(tempfile.mkdtemp(prefix="unibake-profiles-"))
    try:
        shared.chmod(0o755)
        profiles = copy_product(BUSYBOX_PRODUCT, shared / "product")
        for folder in (shared / "product").rglob("*"):
            folder.chmod(0o755 if folder.is_dir() else 0o644)
        (profiles / "shared").mkdir(mode=0o700)
        (profiles / "shared" / "broken.yaml").write_text("profile: [\n")
        make_plan(profiles, verify_lock=False)  # (as root: its modules loaded; the fragment is read and refused)
    except InputError:
        said = as_nobody(lambda: make_plan(profiles, verify_lock=False))
        assert said.startswith(f"InputError: {profiles / 'shared'}: a folder in the profiles folder that cannot be "
                               "read (Permission denied)"), said
    else:
        pytest.fail("a fragment that does not parse passed the plan")
    finally:
        shutil.rmtree(shared)

def test_profile_selection_decides_the_tag(busybox_product):
    assert make_plan(busybox_product).tag == "unibake-test:0.1.0"
    assert make_plan(busybox_product, profiles=["all"]).tag == "unibake-test:0.1.0"
    subset = make_plan(busybox_product, profiles=["tp2"], version="0.2.0")
    assert subset.tag == "unibake-test:0.2.0-tp2"
    assert subset.default_profile == "tp2"  # the product's default (tp1) is not in the image
    with pytest.raises(InputError, match=r"unknown profile 'tp8' \(--profile\); known: tp1, tp2"):
        make_plan(busybox_product, profiles=["tp8"])


def test_two_selections_that_would_share_a_tag_are_refused(busybox_product):
    for name in ("a", "a-b", "b-c", "c"):
        (busybox_product / f"{name}.yaml").write_text(f"profile: {name}\nextends: tp1.yaml\n")
    for selection, other in ((["a", "b-c"], "--profile a-b --profile c"), (["a-b", "c"], "--profile a --profile b-c")):
        with pytest.raises(InputError, match=f"would share the tag unibake-test:0.1.0-a-b-c .* with {other}; "
                                             "rename one of these profiles"):
            make_plan(busybox_product, profiles=selection, verify_lock=False)
    assert make_plan(busybox_product, profiles=["a-b", "tp1"], verify_lock=False).tag == "unibake-test:0.1.0-a-b-tp1"
    # a profile named like two others built together is refused whichever side is built
    with pytest.raises(InputError, match=r"a-b\.yaml: the profile 'a-b' would share the tag unibake-test:0\.1\.0-a-b "
                                         "with the profiles a, b built together"):
        (busybox_product / "b.yaml").write_text("profile: b\nextends: tp1.yaml\n")
        make_plan(busybox_product, profiles=["a-b"], verify_lock=False)


def test_two_components_that_would_share_an_image_label_are_refused(busybox_product):
    from .test_real_stacks import elf

    (busybox_product.parent / "images/x.so").write_bytes(elf())
    (busybox_product / "tp1.yaml").write_text((busybox_product / "tp1.yaml").read_text() +
                                              "sidecars: [{name: x.y, version: '1', prebuilt: images/x.so}]\n")
    (busybox_product / "tp1.x.yaml").write_text("profile: tp1.x\nextends: tp1.yaml\n"
                                                "sidecars: [{name: y, version: '2', prebuilt: images/x.so}]\n")
    with pytest.raises(InputError, match=r"the sidecar 'x\.y' of the profile 'tp1' and the sidecar 'y' of the profile "
                                         r"'tp1\.x' would both be recorded in the image label "
                                         r"io\.unibake\.sidecar\.tp1\.x\.y, so one would be lost"):
        make_plan(busybox_product, profiles=["tp1", "tp1.x"], verify_lock=False)
    make_plan(busybox_product, profiles=["tp1.x"], verify_lock=False)  # apart, each has its own label


def test_a_profile_replaces_an_inherited_sidecar_by_name(demo_product):
    (demo_product / "tp4.yaml").write_text(
        "profile: tp4\nextends: tp2.yaml\ngpus: 4\nargs: [--tp, '4']\n"
        "tune_caches: {source: images/tune/tp4, expect: 5}\n"
        "sidecars:\n  - {name: flash_attn, version: '260700', source: images/kernels/flash_attn}\n")
    plan = make_plan(demo_product)
    tp2, tp4 = plan.profile("tp2"), plan.profile("tp4")
    assert [(k.name, k.version) for k in tp2.sidecars] == [("flash_attn", "260602")]
    assert [(k.name, k.version) for k in tp4.sidecars] == [("flash_attn", "260700")]
    assert tp4.env["NCCL_ALGO"] == "Ring"  # inherited from tp2.yaml
    assert [k.version for k in tp4.kernels(plan.kernels)] == ["260700", "2.1.0", "3.0.1", "1.0.0+cpu"]


def test_a_sidecar_a_profile_lists_twice_is_refused_when_its_parent_lists_sidecars_too(demo_product):
    # found by review: merged by name, the second replaced the first without a word (without a parent's sidecars
    # the plan refused it), and the image baked version 260701 alone
    (demo_product / "tp4.yaml").write_text(
        "profile: tp4\nextends: tp2.yaml\ngpus: 4\nargs: [--tp, '4']\n"
        "tune_caches: {source: images/tune/tp4, expect: 5}\n"
        "sidecars:\n  - {name: flash_attn, version: '260700', source: images/kernels/flash_attn}\n"
        "  - {name: flash_attn, version: '260701', source: images/kernels/flash_attn}\n")
    with pytest.raises(InputError, match=r"tp4\.yaml:\d+: sidecar 'flash_attn' is listed twice"):
        make_plan(demo_product)

def test_a_profiles_folder_nested_deeper_than_the_stack_is_one_error_not_a_traceback(busybox_product):
    made = [busybox_product]
    for _ in range(1200):  # (os.walk recurses once a folder: RecursionError; and so do os.makedirs and rmtree)
        made.append(made[-1] / "d")
        made[-1].mkdir()
    try:
        with pytest.raises(InputError, match=r"profiles: its subfolders are nested deeper than any profiles folder "
                                             "needs"):
            make_plan(busybox_product, verify_lock=False)
    finally:  # removed here, from the bottom up: pytest's clean-up of old temporary folders (rmtree) could not
        for folder in reversed(made[1:]):
            folder.rmdir()


def test_a_profiles_smoke_skip_reaches_the_images_metadata_and_no_skip_leaves_the_label_as_it_was(busybox_product):
    from unibake.metadata import ImageMetadata

    tp1 = busybox_product / "tp1.yaml"
    before = ImageMetadata.from_plan(make_plan(busybox_product)).to_json()
    assert '"skip"' not in before  # an image whose gates all run: the label it had before smoke.skip existed
    tp1.write_text(tp1.read_text().replace("expect_reply: UNIFIED_TP1_OK",
                                           "expect_reply: UNIFIED_TP1_OK, skip: '  needs  the cluster '"))
    metadata = ImageMetadata.from_plan(make_plan(busybox_product))
    assert metadata.profiles["tp1"].smoke.skip == "needs the cluster"
    assert ImageMetadata.model_validate_json(metadata.to_json()).profiles["tp1"].smoke.skip == "needs the cluster"


def test_a_child_profile_runs_the_gate_its_parent_or_product_yaml_skips_with_skip_false(busybox_product):
    # (before: smoke.skip was inherited through extends: and from product.yaml with no way back: skip: null
    # and skip: '' were refused, so a profile extending a skipped one was always released SKIPPED)
    from unibake.metadata import ImageMetadata

    tp1, tp2 = busybox_product / "tp1.yaml", busybox_product / "tp2.yaml"
    before = ImageMetadata.from_plan(make_plan(busybox_product)).to_json()
    tp1.write_text(tp1.read_text().replace("timeout: 20}", "timeout: 20, skip: needs the cluster}"))
    plan = make_plan(busybox_product)
    assert (plan.profile("tp1").smoke.skip, plan.profile("tp2").smoke.skip) == ("needs the cluster",
                                                                                "needs the cluster")
    tp2.write_text(tp2.read_text().replace("{expect_reply: UNIFIED_TP2_OK}",
                                           "{expect_reply: UNIFIED_TP2_OK, skip: false}"))
    plan = make_plan(busybox_product)
    assert (plan.profile("tp1").smoke.skip, plan.profile("tp2").smoke.skip) == ("needs the cluster", None)
    # a grandchild inherits the gate that runs, and may skip it again with its own reason
    (busybox_product / "tp4.yaml").write_text("profile: tp4\nextends: tp2.yaml\ngpus: 4\n"
                                              "tune_caches: {source: images/tune/tp2, expect: 3}\n")
    (busybox_product / "tp8.yaml").write_text("profile: tp8\nextends: tp2.yaml\ngpus: 8\n"
                                              "tune_caches: {source: images/tune/tp2, expect: 3}\n"
                                              "smoke: {skip: needs 8 GPUs}\n")
    plan = make_plan(busybox_product, verify_lock=False)
    assert (plan.profile("tp4").smoke.skip, plan.profile("tp8").smoke.skip) == (None, "needs 8 GPUs")

    # from product.yaml: every profile skipped, one runs its gate again
    (busybox_product / "tp4.yaml").unlink()
    (busybox_product / "tp8.yaml").unlink()
    tp1.write_text(tp1.read_text().replace(", skip: needs the cluster}", ", skip: false}"))
    tp2.write_text(tp2.read_text().replace(", skip: false}", "}"))
    product = busybox_product / "product.yaml"
    product.write_text(product.read_text() + "smoke: {skip: the verify engine has no GPU}\n")
    plan = make_plan(busybox_product)
    assert (plan.profile("tp1").smoke.skip, plan.profile("tp2").smoke.skip) == (None, None)
    # a gate that runs carries the label it had before: skip: false leaves no trace in the image
    tp1.write_text(tp1.read_text().replace(", skip: false}", "}"))
    tp2.write_text(tp2.read_text().replace("{expect_reply: UNIFIED_TP2_OK}",
                                           "{expect_reply: UNIFIED_TP2_OK, skip: false}"))
    plan = make_plan(busybox_product)
    assert (plan.profile("tp1").smoke.skip, plan.profile("tp2").smoke.skip) == ("the verify engine has no GPU", None)
    tp1.write_text(tp1.read_text().replace("timeout: 20}", "timeout: 20, skip: false}"))
    assert ImageMetadata.from_plan(make_plan(busybox_product)).to_json() == before


@pytest.mark.parametrize("value", ["null", "true", "0"])
def test_a_smoke_skip_that_is_neither_a_reason_nor_false_is_refused_saying_false_undoes_an_inherited_one(
        busybox_product, value):
    tp2 = busybox_product / "tp2.yaml"
    tp2.write_text(tp2.read_text().replace("{expect_reply: UNIFIED_TP2_OK}",
                                           f"{{expect_reply: UNIFIED_TP2_OK, skip: {value}}}"))
    kind = {"null": "NoneType", "true": "bool", "0": "int"}[value]
    with pytest.raises(InputError, match=rf"tp2\.yaml:6: key 'smoke\.skip' must be a string, not {kind}.*; or false, "
                                         r"to undo a 'smoke\.skip' the file it extends sets$"):
        make_plan(busybox_product)


def test_a_profile_saved_with_windows_line_ends_is_read_and_a_lone_carriage_return_is_refused(busybox_product):
    # \r\n is a line end everywhere; \r alone is one to YAML only (git, grep and a terminal show one line)
    tp2 = busybox_product / "tp2.yaml"
    tp2.write_bytes(tp2.read_bytes().replace(b"\n", b"\r\n"))
    assert [p.gpus for p in make_plan(busybox_product, verify_lock=False).profiles] == [1, 2]
    tp2.write_bytes(tp2.read_bytes().replace(b"\r\n", b"\r", 1))
    with pytest.raises(InputError, match=r"tp2\.yaml:1: holds a carriage return \(\\r\) not followed by a line feed"):
        make_plan(busybox_product, verify_lock=False)


@pytest.mark.parametrize("nodes,skip,refused", [(1023, "", False), (1024, "", True),
                                                (1024, "\n  skip: a bridge holds 1023 ranks", False)])
def test_more_nodes_than_the_gate_can_start_need_smoke_skip(busybox_product, nodes, skip, refused):
    # (before: 1024 nodes passed the plan, and the gate failed at its last rank, after the build and round trip)
    tp2 = busybox_product / "tp2.yaml"
    tp2.write_text(tp2.read_text().replace("smoke: {expect_reply: UNIFIED_TP2_OK}",
                                           f"smoke:\n  expect_reply: UNIFIED_TP2_OK{skip}\n") +
                   f"topology: {{nodes: {nodes}}}\n")
    if refused:
        with pytest.raises(InputError, match=r"tp2\.yaml:\d+: key 'topology.nodes' is 1024, more ranks than the smoke "
                                             r"gate can start .* or give smoke.skip with the reason"):
            make_plan(busybox_product, verify_lock=False)
    else:
        assert make_plan(busybox_product, verify_lock=False).profile("tp2").topology.nodes == nodes
