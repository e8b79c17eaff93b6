"""What the platform's apps share and none of them owns: the one boto3 adaptor (`common.awsapi`, used by the aws
provider and the recommender's price refresh), the one retry helper for platform-side retries (`common.retry`),
numbers as people read them (`common.numbers`: the job page's results and the monitor's alerts), and a wheel's
metadata — its one `.dist-info` directory, its Requires-Dist as pip reads it on a node (`common.wheels`: the upload's
checks and the bootstrap's torch install).

A leaf: it imports none of fc2, recommender, provisioner or monitor (an import-linter contract in pyproject.toml), so
every app may import it. The node agent (monitor/agent.py) keeps its own stdlib-only retry: it runs on the nodes.
"""
