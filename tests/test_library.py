"""The library: one entry per wheel an owner uploads, however often they upload it."""

from fc2.models import CodeBundle
from fc2.services.bundles import store_bundle


def test_same_wheel_twice_is_one_bundle(alice, bundle, example_wheel):
    with example_wheel.open("rb") as wheel:
        again = store_bundle(alice, wheel, example_wheel.name)

    assert again.pk == bundle.pk
    assert CodeBundle.objects.filter(owner=alice).count() == 1
    folders, _ = bundle.wheel.storage.listdir(f"bundles/{alice.pk}")
    assert len(folders) == 1


def test_same_wheel_by_another_owner_is_their_own(bob, bundle, example_wheel):
    with example_wheel.open("rb") as wheel:
        theirs = store_bundle(bob, wheel, example_wheel.name)

    assert theirs.pk != bundle.pk
    assert theirs.owner == bob
