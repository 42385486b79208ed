from specli.decode.text import TextStream


def test_a_character_split_across_tokens_is_released_whole():
    stream = TextStream()
    data = "é€😀".encode()
    released = [stream.push(data[i : i + 1]) for i in range(len(data))]
    assert "".join(released) == "é€😀"
    assert all(r in ("", "é", "€", "😀") for r in released)


def test_stop_string_across_tokens_is_held_then_cut():
    stream = TextStream(["END"])
    out = [stream.push(b"abc E"), stream.push(b"N"), stream.push(b"Dzz")]
    assert out == ["abc ", "", ""]
    assert stream.stopped and stream.flush() == ""


def test_held_text_that_does_not_become_a_stop_is_released():
    stream = TextStream(["END"])
    assert stream.push(b"xE") == "x"
    assert stream.push(b"Nd") == "ENd"
    assert stream.push(b"E") == ""
    assert stream.flush() == "E"
