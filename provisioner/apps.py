from django.apps import AppConfig


class ProvisionerConfig(AppConfig):
    name = "provisioner"
