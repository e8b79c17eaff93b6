from django.apps import AppConfig


class Fc2Config(AppConfig):
    name = "fc2"
    verbose_name = "FC² platform"

    def ready(self) -> None:
        from fc2 import checks  # noqa: F401 - registers the system checks
