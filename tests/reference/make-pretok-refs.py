#!/usr/bin/env python3
# tests/reference/make-pretok-refs.py - makes tests/reference/pretok.txt: llama.cpp's token ids of
# test strings under the pre-tokenizers whose own vocabularies are not among the fixtures
# (deepseek-v3, glm4, gpt-4o, kimi-k2). The GPT-2 vocabulary of the fixtures is copied with tokenizer.ggml.pre
# rewritten, and llama-tokenize (the peer, built by ../shared/tools/build-peer-llama.sh) encodes
# every string of the fixture .inp files and a few more without BOS. Each line of the output:
# "PRE HEX_OF_THE_UTF8_STRING ID,ID,..." (an empty list is "-").
# usage: tests/reference/make-pretok-refs.py PEER_DIR [FIXTURES_DIR]
import glob, os, struct, subprocess, sys, tempfile

peer = sys.argv[1]
fixtures = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(__file__), '../../../shared/fixtures')
here = os.path.dirname(os.path.abspath(__file__))
EXTRA = ["日本語のテキストと漢字123456", "don't I'll WE'RE 3.14159", "a\u0301b\u0308c  \u00a0 x\n\n\r\n y",
         "~~~abc ~x $5 +++foo", "tab\tx\u2003y  \n  z", "emoji 😀😀 ok!!\n\n", "ÅngströmΩ µ ß", " ", "\n",
         "  ", "Hello,world", "_init_ {a:1}", "١٢٣٤ ٥", "ｶﾀｶﾅ ひらがな カタカナ", "x\u0300\u0301y", "price: $1,234.56!",
         "HELLOworld ÀBC McDonald's iPhone XR", "ΑΒΓδε camelCaseWord ALLCAPS x'S y'LL", "path/to/file\n/x",
         "a//b\r\n\r\n--c", "ÉCOLE école Éé", "Straße STRASSE ǅungla", "12345678 ٣٤٥٦",
         "中文English混合123汉字's", "漢字'S 你好，世界！\n\n", "\U00020000\U00020001 ext-B 丽兀 compat", "'s 'T 'Ll x'RE",
         "HELLO'S Fußball's ñ\u0303'd", " 中a 中 a中", "Ａ中ｂ一二三", "ᄀ가각 ㄱ", "\u3007〇々 〆",
         "'sthey\n'stis\n'sem\n'se\n'redon\n'resup\n'ree\n'vedon\n'msup\n'llem\n'lle\n'Sit\n'SI\n'Scan\n'Se",
         " 国 的 日本 人a", "x'sthey\n中'sem\n国'llem"]


def rewrite_pre(src, dst, pre):
    """Copies a vocabulary-only GGUF, replacing the string value of tokenizer.ggml.pre."""
    b = open(src, 'rb').read()
    o = 24
    _, _, nt, nkv = struct.unpack_from('<4sIQQ', b, 0)
    assert nt == 0, 'a vocabulary-only file is expected'
    out = bytearray(b[:24])
    size = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def skip(t, o):
        if t == 8:
            (n,) = struct.unpack_from('<Q', b, o)
            return o + 8 + n
        if t == 9:
            at, n = struct.unpack_from('<IQ', b, o)
            o += 12
            for _ in range(n):
                o = skip(at, o)
            return o
        return o + size[t]

    for _ in range(nkv):
        start = o
        (n,) = struct.unpack_from('<Q', b, o)
        key = b[o + 8:o + 8 + n].decode()
        o += 8 + n
        (t,) = struct.unpack_from('<I', b, o)
        o = skip(t, o + 4)
        if key == 'tokenizer.ggml.pre':
            v = pre.encode()
            out += struct.pack('<Q', n) + key.encode() + struct.pack('<IQ', 8, len(v)) + v
        else:
            out += b[start:o]
    out += b[o:]
    open(dst, 'wb').write(out)


strings = []
for f in sorted(glob.glob(os.path.join(fixtures, 'tokenizer', '*.inp'))):
    strings += [s for s in open(f, 'rb').read().split(b'\n__ggml_vocab_test__\n') if s]
strings += [s.encode() for s in EXTRA]
lines = []
with tempfile.TemporaryDirectory() as tmp:
    for pre in ('deepseek-v3', 'glm4', 'gpt-4o', 'kimi-k2'):
        vocab = os.path.join(tmp, pre + '.gguf')
        rewrite_pre(os.path.join(fixtures, 'tokenizer', 'ggml-vocab-gpt-2.gguf'), vocab, pre)
        for s in strings:
            txt = os.path.join(tmp, 'in.txt')
            open(txt, 'wb').write(s)
            r = subprocess.run([os.path.join(peer, 'build/bin/llama-tokenize'), '-m', vocab, '-f', txt,
                                '--ids', '--log-disable', '--no-bos'], capture_output=True, check=True)
            ids = r.stdout.strip().split(b'\n')[-1].decode().strip('[]').replace(' ', '')
            lines.append(f"{pre} {s.hex()} {ids or '-'}")
with open(os.path.join(here, 'pretok.txt'), 'w') as out:
    out.write('# llama.cpp token ids (llama-tokenize --no-bos) of test strings, GPT-2 vocabulary with\n')
    out.write('# tokenizer.ggml.pre rewritten; made by tests/reference/make-pretok-refs.py.\n')
    out.write('# PRE HEX_OF_THE_UTF8_STRING IDS\n')
    out.write('\n'.join(lines) + '\n')
print(f'{len(lines)} lines')
