"""Cluster recommendation: instance catalogues, performance records and the FC²/Anwar algorithms."""
