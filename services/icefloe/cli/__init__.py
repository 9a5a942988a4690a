"""The ``icefloe`` console command."""
