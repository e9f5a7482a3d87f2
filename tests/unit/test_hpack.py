"""HPACK against RFC 7541's Appendix C examples (the hex as golang.org/x/net v0.57.0's
http2/hpack/hpack_test.go transcribes it: Go's is the encoder the kubelet uses), and the errors
the decoder must raise on what a hostile server could send."""

from __future__ import annotations

import pytest

from gpumon.exporter.podresources.hpack import (
    Decoder,
    HeaderListTooLarge,
    HpackError,
    decode_integer,
    encode_integer,
    encode_literals,
    huffman_decode,
)


def dehex(text: str) -> bytes:
    return bytes.fromhex("".join(text.split()))


def h(*pairs: tuple[str, str]) -> list[tuple[bytes, bytes]]:
    return [(n.encode(), v.encode()) for n, v in pairs]


@pytest.mark.parametrize(
    ("value", "prefix", "encoded"),
    [(10, 5, "0a"), (1337, 5, "1f9a0a"), (42, 8, "2a")],  # C.1.1, C.1.2, C.1.3
)
def test_integers_c1(value: int, prefix: int, encoded: str) -> None:
    assert encode_integer(value, prefix) == dehex(encoded)
    assert decode_integer(dehex(encoded), 0, prefix) == (value, len(dehex(encoded)))


@pytest.mark.parametrize(
    ("block", "headers"),
    [
        (
            "400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572",
            h(("custom-key", "custom-header")),
        ),  # C.2.1
        ("040c 2f73 616d 706c 652f 7061 7468", h((":path", "/sample/path"))),  # C.2.2
        ("1008 7061 7373 776f 7264 0673 6563 7265 74", h(("password", "secret"))),  # C.2.3
        ("82", h((":method", "GET"))),  # C.2.4
    ],
)
def test_single_fields_c2(block: str, headers: list[tuple[bytes, bytes]]) -> None:
    assert Decoder(max_header_list_size=4096).decode(dehex(block)) == headers


REQUESTS = [
    h((":method", "GET"), (":scheme", "http"), (":path", "/"), (":authority", "www.example.com")),
    h(
        (":method", "GET"),
        (":scheme", "http"),
        (":path", "/"),
        (":authority", "www.example.com"),
        ("cache-control", "no-cache"),
    ),
    h(
        (":method", "GET"),
        (":scheme", "https"),
        (":path", "/index.html"),
        (":authority", "www.example.com"),
        ("custom-key", "custom-value"),
    ),
]
RESPONSES = [
    h(
        (":status", "302"),
        ("cache-control", "private"),
        ("date", "Mon, 21 Oct 2013 20:13:21 GMT"),
        ("location", "https://www.example.com"),
    ),
    h(
        (":status", "307"),
        ("cache-control", "private"),
        ("date", "Mon, 21 Oct 2013 20:13:21 GMT"),
        ("location", "https://www.example.com"),
    ),
    h(
        (":status", "200"),
        ("cache-control", "private"),
        ("date", "Mon, 21 Oct 2013 20:13:22 GMT"),
        ("location", "https://www.example.com"),
        ("content-encoding", "gzip"),
        ("set-cookie", "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1"),
    ),
]

SERIES = {
    # Three requests on one connection: each refers to what the previous ones indexed.
    "C.3": (
        4096,
        [
            "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
            "8286 84be 5808 6e6f 2d63 6163 6865",
            "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
        ],
        REQUESTS,
    ),
    "C.4": (
        4096,
        [
            "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
            "8286 84be 5886 a8eb 1064 9cbf",
            "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
        ],
        REQUESTS,
    ),
    # Responses with a 256-byte table, so that entries are evicted.
    "C.5": (
        256,
        [
            """4803 3330 3258 0770 7269 7661 7465 611d
            4d6f 6e2c 2032 3120 4f63 7420 3230 3133
            2032 303a 3133 3a32 3120 474d 546e 1768
            7474 7073 3a2f 2f77 7777 2e65 7861 6d70
            6c65 2e63 6f6d""",
            "4803 3330 37c1 c0bf",
            """88c1 611d 4d6f 6e2c 2032 3120 4f63 7420
            3230 3133 2032 303a 3133 3a32 3220 474d
            54c0 5a04 677a 6970 7738 666f 6f3d 4153
            444a 4b48 514b 425a 584f 5157 454f 5049
            5541 5851 5745 4f49 553b 206d 6178 2d61
            6765 3d33 3630 303b 2076 6572 7369 6f6e
            3d31""",
        ],
        RESPONSES,
    ),
    "C.6": (
        256,
        [
            """4882 6402 5885 aec3 771a 4b61 96d0 7abe
            9410 54d4 44a8 2005 9504 0b81 66e0 82a6
            2d1b ff6e 919d 29ad 1718 63c7 8f0b 97c8
            e9ae 82ae 43d3""",
            "4883 640e ffc1 c0bf",
            """88c1 6196 d07a be94 1054 d444 a820 0595
            040b 8166 e084 a62d 1bff c05a 839b d9ab
            77ad 94e7 821d d7f2 e6c7 b335 dfdf cd5b
            3960 d5af 2708 7f36 72c1 ab27 0fb5 291f
            9587 3160 65c0 03ed 4ee5 b106 3d50 07""",
        ],
        RESPONSES,
    ),
}


@pytest.mark.parametrize("section", sorted(SERIES))
def test_header_lists_on_one_connection(section: str) -> None:
    table_size, blocks, lists = SERIES[section]
    decoder = Decoder(max_header_list_size=4096, max_table_size=table_size)
    assert [decoder.decode(dehex(b)) for b in blocks] == lists


@pytest.mark.parametrize("section", ["C.5", "C.6"])
def test_the_256_byte_table_keeps_what_the_rfc_says(section: str) -> None:
    """After the third response the table holds set-cookie, content-encoding and the new date
    (RFC 7541 C.5.3, C.6.3): the older entries were evicted, so index 65 names nothing."""
    table_size, blocks, lists = SERIES[section]
    decoder = Decoder(max_header_list_size=4096, max_table_size=table_size)
    for b in blocks:
        decoder.decode(dehex(b))
    assert decoder.decode(dehex("be bf c0")) == [lists[2][5], lists[2][4], lists[2][2]]
    with pytest.raises(HpackError):
        decoder.decode(dehex("c1"))


@pytest.mark.parametrize(
    "data",
    [
        b"\xff",  # padding of 8 bits
        b"\x1f\xff",  # "a" and a byte of excess padding
        b"\x1f\xff\xff\xff",
        b"\xff\x9f\xff\xff\xff",  # 29 bits of padding
        b"R\xbc0\xff\xff\xff\xff",  # padding ending on part of a symbol
        b"\xfe",  # padding not all ones
        b"\xff\xff\xff\xfc",  # EOS (30 ones) inside the string
    ],
)
def test_huffman_refuses_bad_padding_and_eos(data: bytes) -> None:
    with pytest.raises(HpackError):
        huffman_decode(data)


@pytest.mark.parametrize(
    ("block", "why"),
    [
        ("80", "index 0"),
        ("be", "index 62 with an empty dynamic table"),
        ("ff80", "index past both tables"),
        ("0005 6162", "a name longer than the block"),
        ("1f", "an integer cut short"),
        ("1fff ffff ffff ff01", "an integer of six continuation bytes"),
        ("3fe2 1f", "a table size update to 4,097, above the 4,096 allowed"),
        ("82 20", "a table size update after a field"),
    ],
)
def test_invalid_blocks_are_refused(block: str, why: str) -> None:
    with pytest.raises(HpackError):
        Decoder(max_header_list_size=4096).decode(dehex(block))


def test_a_size_update_to_zero_empties_the_table() -> None:
    decoder = Decoder(max_header_list_size=4096)
    assert decoder.decode(dehex("400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572"))
    assert decoder.decode(dehex("be")) == h(("custom-key", "custom-header"))
    decoder.decode(dehex("20"))
    with pytest.raises(HpackError):
        decoder.decode(dehex("be"))


def test_header_list_is_bounded_while_decoding() -> None:
    # The same indexed field repeated: each byte decodes to 32 + 7 + 3 bytes of header list.
    decoder = Decoder(max_header_list_size=1000)
    assert len(decoder.decode(b"\x82" * 23)) == 23
    with pytest.raises(HeaderListTooLarge):
        decoder.decode(b"\x82" * 24)


def test_our_literals_decode_to_what_was_encoded() -> None:
    headers = h((":path", "/v1.PodResourcesLister/List"), ("grpc-timeout", "500m"), ("x-long", "v" * 300))
    assert Decoder(max_header_list_size=4096).decode(encode_literals(headers)) == headers
