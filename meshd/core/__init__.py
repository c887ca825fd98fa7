"""The pure core: decisions and codecs with no I/O, no clock reads, no trio, no libp2p."""
