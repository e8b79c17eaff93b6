from django.apps import AppConfig


class Fc2Config(AppConfig):
    name = "fc2"
    verbose_name = "FC² platform"
