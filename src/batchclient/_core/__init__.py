"""The core data path: request -> encode -> scheduler -> provider -> decode (``docs/design.md``).

Imports flow one way: ``request`` < ``checks`` < ``encode`` / ``decode`` < ``scheduler`` <
``provider`` < ``client``. The public names are re-exported by ``batchclient``.
"""
