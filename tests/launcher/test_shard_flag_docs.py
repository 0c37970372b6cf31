"""The shard's defaults have one source, its command line's config (`ServeConfig` in
shard_server/cli.py). The launcher's help (launcher/options.py) and README.md's flag table
repeat the ones that are values: each must be the shard's, so a changed default fails here
until every page agrees. (The router's defaults: test_router_flag_docs.py.)"""

import dataclasses

from launcher.options import OPTIONS, SHARD
from shard_server.cli import ServeConfig

from test_router_flag_docs import _disagreements, _value, readme_defaults


def shard_defaults() -> dict[str, str]:
    """Shard flag → its default, for the fields whose default is a value (not None)."""
    return {
        f"--{field.name.replace('_', '-')}": str(field.default)
        for field in dataclasses.fields(ServeConfig)
        if field.default is not dataclasses.MISSING and field.default is not None
    }


def launcher_shard_defaults() -> dict[str, str]:
    return {
        option.long_flag: option.child_default
        for option in OPTIONS
        if SHARD in option.forward and option.child_default is not None and _value(option.child_default)
    }


def test_the_launcher_gives_the_shards_defaults_as_values():
    source, launcher = shard_defaults(), launcher_shard_defaults()
    forwarded = {option.long_flag for option in OPTIONS if SHARD in option.forward and not option.switch}
    # Every shard flag the launcher forwards and whose default is a value shows that value.
    assert forwarded & source.keys() <= launcher.keys(), sorted((forwarded & source.keys()) - launcher.keys())
    assert len(launcher.keys() & source.keys()) >= 5
    assert not _disagreements(launcher, source)


def test_the_readme_gives_the_shards_defaults():
    source, readme = shard_defaults(), readme_defaults()
    assert {"--kv-cache-tokens", "--cuda-memory-fraction"} <= readme.keys() & source.keys()
    assert not _disagreements(readme, source)


def test_a_changed_shard_default_is_caught_on_each_page():
    moved = {**shard_defaults(), "--cuda-memory-fraction": "0.5", "--kv-cache-tokens": "1"}
    for page in (launcher_shard_defaults(), readme_defaults()):
        assert _disagreements(page, moved), page
