"""`is_hub_id` is huggingface_hub's `validate_repo_id` plus an owner: what it accepts, and the paths it
leaves to `public_path`."""

import pytest

from hf_vrl.hub.data_names import describe_dataset, is_hub_id, is_local, public_path


@pytest.mark.parametrize(
    "name", ["openai/clip-vit-base-patch32", "zalando-datasets/fashion_mnist", "a/b.c_d"]
)
def test_hub_ids(name):
    assert is_hub_id(name) and not is_local(name)


@pytest.mark.parametrize(
    "name",
    [
        "bert-base-uncased",  # no owner: a preset name here, not a card's dataset id
        "/abs/path",
        "./rel/path",
        ".hidden/x",
        "a/b/c",
        "owner/name-",  # the Hub refuses a trailing '-' or '.', '--', '..' and '.git'
        "owner/name.",
        "owner/na--me",
        "owner/name.git",
        "owner/" + "x" * 97,
        "owner/name\n",
        "",
    ],
)
def test_not_hub_ids(name):
    assert not is_hub_id(name)


def test_an_invalid_id_with_a_slash_is_a_local_path_and_is_shortened():
    assert is_local("my--data/train") and public_path("webdataset:my--data/train") == "webdataset:…/train"
    assert describe_dataset("hf:owner/name").hub_id == "owner/name"
    assert describe_dataset("hf:owner/na--me").hub_id is None


def test_a_benchmark_by_its_registry_name_is_named_on_the_card_but_never_indexed():
    """`<key>:<folder>` (hf_vrl.data.benchmarks) names the benchmark a local copy holds; no Hub id, so the
    number stays on the card's table (a local copy is not the Hub dataset)."""
    for spec, title in (
        ("imagenet-r:/data/imagenet-r", "ImageNet-R (a local copy)"),
        ("cub:/data/CUB_200_2011", "CUB-200-2011 (a local copy)"),
        ("cc3m:/data/cc3m", "Conceptual Captions 3M (img2dataset) (a local copy)"),
    ):
        name = describe_dataset(spec)
        assert (name.type, name.name, name.hub_id) == (spec.partition(":")[0], title, None)
