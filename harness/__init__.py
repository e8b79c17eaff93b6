"""Stand-ins that the tests and the benchmarks both run against: hand-made wheels (`wheels`) and EC2 on this machine
(`ec2lab`: moto's EC2 server, its instances lab hosts).

Not tests, so that a benchmark needs neither pytest's tree nor its conftest; not in an app, since the platform never
runs them: nothing here is installed with it (pyproject.toml's packages), and no app imports it.
"""
