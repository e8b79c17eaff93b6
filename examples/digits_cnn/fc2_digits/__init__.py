"""Example FC² training bundle: a tiny CNN trained with ``tf.distribute`` custom training loops.

Entry point: ``python -m fc2_digits.main --epochs=2 --batch_size=32 ...`` (see ``fc2_digits.main``).
"""

__version__ = "0.1.0"
