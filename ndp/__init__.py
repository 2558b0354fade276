"""ndp: the Neural Datagram Protocol data loader."""
from ndp.format import Dst, DropReason, Src, Typ
from ndp.packet import Packet, crc16_ccitt, decode_packet, encode_packet, encode_tokens
