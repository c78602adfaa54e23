import json
import urllib.error
import urllib.request

import pytest

pytest.importorskip("bm25s")

from trace_rl.envs.qa_env import NO_HITS, QAEnv, exact_match, f1_score, normalize_answer  # noqa: E402
from trace_rl.envs.retrieval import BM25Retriever, load_corpus, recall_at_k  # noqa: E402
from trace_rl.envs.retrieval_server import RemoteRetriever, serve  # noqa: E402

CORPUS = {
    "Jaws (film)": ["Jaws is a 1975 thriller film directed by Steven Spielberg."],
    "Steven Spielberg": ["Steven Spielberg was born in Cincinnati, Ohio."],
    "Cincinnati": ["Cincinnati is a city on the Ohio River."],
    "Shark": ["Sharks are fish with cartilage skeletons."],
}


@pytest.fixture
def retriever(tmp_path):
    path = tmp_path / "corpus.json"
    path.write_text(json.dumps(CORPUS))
    return BM25Retriever(load_corpus(path))


def test_normalisation_em_f1_and_aliases():
    assert normalize_answer("The  Cincinnati, Ohio!") == "cincinnati ohio"
    assert exact_match("cincinnati", ["Cincinnati, Ohio", "Cincinnati"]) == 1.0
    assert exact_match("Ohio", "Cincinnati") == 0.0
    assert f1_score("Cincinnati Ohio", "Cincinnati") == pytest.approx(2 / 3)


def test_search_answer_fork(retriever):
    env = QAEnv(retriever, top_k=2)
    env.reset({"question": "Where was the director of Jaws born?", "answer": ["Cincinnati"]})
    obs, *_ = env.step("Action: search[director of Jaws]")
    assert obs.startswith('"Jaws (film)"')
    twin = env.fork()
    assert twin.step("Action: answer[Ohio]")[1] == 0.0 and not env.done
    obs, r, done, info = env.step("Action: answer[Cincinnati]")
    assert (r, done, info["f1"]) == (1.0, True, 1.0)
    env.reset({"question": "q", "answer": "a"})
    assert "Invalid action" in env.step("search for sharks")[0]
    assert "empty query" in env.step("Action: search[]")[0]


def test_recall_and_search_r1_compatible_server(retriever):
    assert recall_at_k(retriever, ["Spielberg birthplace"], [{"Steven Spielberg"}], k=1) == 1.0
    server = serve(retriever, "127.0.0.1", 0)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        body = json.dumps({"queries": ["Ohio River city"], "topk": 1, "return_scores": True}).encode()
        req = urllib.request.Request(url + "/retrieve", body, {"Content-Type": "application/json"})
        result = json.loads(urllib.request.urlopen(req, timeout=5).read())["result"]
        assert result[0][0]["document"]["contents"].startswith('"Cincinnati"\n') and "score" in result[0][0]
        assert RemoteRetriever(url).search(["shark fish"], 1)[0][0][0].title == "Shark"
        bad = urllib.request.Request(url + "/retrieve", b'{"queries": 3}', {"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(bad, timeout=5)
        assert err.value.code == 400
    finally:
        server.shutdown()
    assert server.server_address[0] == "127.0.0.1"


def test_shared_corpus_recall_if_present():
    from helpers_data import shared_data_or_skip

    root = shared_data_or_skip("qa/corpus/hotpotqa_train.json", "qa/corpus/hotpotqa_train_corpus.json") / "qa/corpus"
    questions = json.loads((root / "hotpotqa_train.json").read_text())
    r = BM25Retriever(load_corpus(root / "hotpotqa_train_corpus.json"))
    sup = [{t for t, _ in q["supporting_facts"]} for q in questions]
    assert recall_at_k(r, [q["question"] for q in questions], sup, k=5) > 0.5


def test_dense_retriever_with_a_tiny_local_encoder(tmp_path):
    pytest.importorskip("faiss")
    pytest.importorskip("torch")
    from transformers import BertConfig, BertModel

    from trace_rl.envs.retrieval import DenseRetriever, Passage
    from trace_rl.lm.tokenizer import byte_tokenizer

    tok = byte_tokenizer()
    BertModel(
        BertConfig(
            vocab_size=len(tok),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            pad_token_id=tok.pad_token_id,
        )
    ).save_pretrained(tmp_path / "enc")
    tok.save_pretrained(tmp_path / "enc")
    passages = [Passage(str(i), t, " ".join(s)) for i, (t, s) in enumerate(CORPUS.items())]
    r = DenseRetriever(passages, encoder=str(tmp_path / "enc"))
    hits = r.search(["Spielberg", "shark"], k=2)
    assert len(hits) == 2 and all(len(h) == 2 for h in hits)
    assert hits[0][0][1] >= hits[0][1][1]  # sorted by similarity
    exact = r.search([passages[1].contents], k=1)[0][0][0]
    assert exact.title == "Steven Spielberg"  # a passage's own text is its nearest neighbour


def test_a_query_with_no_hits_says_so(retriever):
    env = QAEnv(retriever)
    env.reset({"question": "q", "answer": "a"})
    obs, _, done, info = env.step("Action: search[zebra quantum]")  # no passage shares a word with it
    assert obs == NO_HITS and not done and info["no_hits"]


def test_a_dead_retriever_stops_the_run_when_the_env_is_built_in_one_line():
    from trace_rl.envs.registry import get_env
    from trace_rl.errors import ConfigError

    with pytest.raises(ConfigError) as err:  # port 1: nothing listens
        get_env("qa", retriever_url="http://127.0.0.1:1/retrieve")
    message = str(err.value)
    assert message.startswith("env.qa.retriever_url: retriever at http://127.0.0.1:1/retrieve unreachable")
    assert "\n" not in message
    with pytest.raises(ValueError, match=r"retriever_url must be an http\(s\) URL"):  # the setting's own check
        get_env("qa", retriever_url="ftp://x")


def test_a_live_retriever_passes_the_probe(retriever):
    from trace_rl.envs.registry import get_env

    server = serve(retriever, "127.0.0.1", 0)
    try:
        spec = get_env("qa", retriever_url=server.url)
        env = spec.make()
        env.reset({"question": "q", "answer": "a"})
        assert env.step("Action: search[shark fish]")[0].startswith('"Shark"')
    finally:
        server.shutdown()
