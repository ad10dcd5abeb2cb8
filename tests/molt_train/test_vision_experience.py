"""Image rows on the trainer's data path, on the tiny VLM's processor (no Ray): the SFT encoding expands a row's
images like a rollout, experience rows keep their ``VisionInputs`` through selection, a micro-batch concatenates its
rows' tensors in row order (the forward's log-probs then equal each row's own forward), a ``max_len`` cut through a
later turn's image placeholders drops the trajectory, and JSONL rows name their images by ``--data.image_key``."""

from __future__ import annotations

import base64
import io
import json

import pytest
import torch

from molt_envs import Trajectory
from molt_envs.envs.shapes import make_row
from molt_envs.vision import ImageError, text_tokenizer, vision_codec
from molt_train.config import parse
from molt_train.data import encode_sft, load_rows
from molt_train.experience import drop_reason, make_experience, micro_batch
from molt_train.logprob_model import LogProbModel
from molt_train.models.multimodal import load_model, placeholder_ids


def _png(seed: int) -> bytes:
    buffer = io.BytesIO()
    make_row(seed)["image"].save(buffer, format="PNG")
    return buffer.getvalue()


def _trajectory(tiny_vl_engine, seed: int, reply: str) -> Trajectory:
    """A one-turn trajectory of the shapes row ``seed``: its prompt as the SFT encoding makes it, ``reply`` acted."""
    row = make_row(seed)
    ids, mask, mm = encode_sft(tiny_vl_engine.processor, row["question"], reply, max_len=256, images=[row["image"]])
    prompt = [i for i, m in zip(ids, mask, strict=True) if not m]
    traj = Trajectory(token_ids=list(prompt), log_probs=[0.0] * len(prompt), prompt_len=len(prompt), reward=1.0)
    traj.append_action(ids[len(prompt) :], [-1.0] * (len(ids) - len(prompt)))
    traj.images, traj.mm_inputs = mm.images, mm
    return traj


def test_sft_encoding_expands_the_images_and_refuses_them_on_a_text_model(tiny_vl_engine, tiny_tokenizer):
    codec = vision_codec(tiny_vl_engine.processor)
    row = make_row(3)
    ids, mask, mm = encode_sft(tiny_vl_engine.processor, row["question"], row["answer"], 256, [row["image"]])
    assert ids.count(codec.image_token_id) == sum(mm.token_counts) == 36  # 48 px / 8 px patches, squared
    assert mm.tensors["pixel_values"].shape == (1, 3, 48, 48)
    reply = [i for i, m in zip(ids, mask, strict=True) if m]
    assert text_tokenizer(tiny_vl_engine.processor).decode(reply) == f"{row['answer']}<|im_end|>"
    assert codec.image_token_id not in reply
    with pytest.raises(ValueError, match="raise --data.max_len"):
        encode_sft(tiny_vl_engine.processor, row["question"], row["answer"], 30, [row["image"]])
    with pytest.raises(ImageError, match="text-only"):
        encode_sft(tiny_tokenizer, row["question"], row["answer"], 256, [row["image"]])


def test_micro_batches_carry_their_rows_images_in_row_order(tiny_vl_engine, tiny_vl_dir):
    trajs = [_trajectory(tiny_vl_engine, seed, reply) for seed, reply in [(1, "3"), (2, "red"), (5, "no")]]
    exp = make_experience(trajs, max_len=256, pad_id=0)
    assert [m.images for m in exp.mm] == [t.images for t in trajs]
    sub = exp.select([2, 0])
    assert sub.mm[0] is trajs[2].mm_inputs and sub.mm[1] is trajs[0].mm_inputs
    mb = micro_batch(exp, [2, 0], pad_id=0)
    pixels = torch.cat([trajs[2].mm_inputs.tensors["pixel_values"], trajs[0].mm_inputs.tensors["pixel_values"]])
    assert torch.equal(mb["mm"]["pixel_values"], pixels)

    model = LogProbModel(load_model(tiny_vl_dir).eval(), chunk_size=64, share_prefixes=True)
    with torch.no_grad():
        batched = model(mb["input_ids"], mb["attention_mask"], 1.0, mb["action_mask"], mb["mm"])
        for row, traj in zip(batched, (trajs[2], trajs[0]), strict=True):
            ids = torch.tensor([traj.token_ids])
            alone = model(ids, torch.ones_like(ids), 1.0, None, traj.mm_inputs.tensors)[0]
            assert torch.allclose(row[: len(alone)], alone, atol=1e-5)
    # another image in the same row changes the log-probs: the forward reads the pixels it was given
    other = {"pixel_values": mb["mm"]["pixel_values"].flip(0)}
    with torch.no_grad():
        swapped = model(mb["input_ids"], mb["attention_mask"], 1.0, mb["action_mask"], other)
    assert not torch.allclose(swapped, batched)


def test_a_cut_through_a_later_turns_image_drops_the_trajectory(tiny_vl_engine):
    traj = _trajectory(tiny_vl_engine, 4, "2")
    later = _trajectory(tiny_vl_engine, 6, "1")  # its prompt is a later turn's observation, with its own image
    acted = len(traj.token_ids)
    traj.append_observation(later.token_ids[: later.prompt_len])
    traj.images, traj.mm_inputs = traj.images + later.images, traj.mm_inputs + later.mm_inputs
    assert drop_reason(traj, max_len=len(traj.token_ids)) is None
    assert drop_reason(traj, max_len=acted + 3) == "image_tokens_truncated"  # the action fits, the image would not


def test_a_sampled_image_placeholder_drops_the_trajectory(tiny_vl_engine, tiny_tokenizer):
    placeholders = placeholder_ids(tiny_vl_engine.processor)
    assert placeholders == {vision_codec(tiny_vl_engine.processor).image_token_id}
    assert placeholder_ids(tiny_tokenizer) == frozenset()  # a text model has none
    traj = _trajectory(tiny_vl_engine, 4, "2")
    assert drop_reason(traj, 256, placeholders) is None  # the prompt's placeholders are the image's
    (image_id,) = placeholders
    traj.append_action([image_id], [-1.0])  # the policy sampled one: no image behind it
    assert drop_reason(traj, 256, placeholders) == "placeholder_generated"


def test_jsonl_rows_name_their_images_by_image_key(tmp_path):
    (tmp_path / "fig.png").write_bytes(_png(7))
    encoded = base64.b64encode(_png(8)).decode()
    rows = [
        {"q": "How many shapes are there?", "a": "2", "img": "fig.png"},
        {"q": "What colour is the circle?", "a": "red", "img": [f"data:image/png;base64,{encoded}", encoded]},
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    flags = ["--env", "molt/shapes-v1", "--data.prompt_dataset", str(path), "--data.input_key", "q"]
    flags += ["--data.label_key", "a"]
    flags += ["--actor.model_name_or_path", str(tmp_path), "--ckpt.output_dir", str(tmp_path / "out")]
    loaded = load_rows(parse("rl", [*flags, "--data.image_key", "img"]))
    assert loaded[0]["images"] == [_png(7)]  # a path, relative to the file, read as bytes
    assert loaded[1]["images"] == rows[1]["img"]  # base64 / data: URIs as they are: the runner decodes them
    assert load_rows(parse("rl", flags))[0]["images"] == []
    with pytest.raises(ValueError, match="no 'image' field.*fix --data.image_key"):
        load_rows(parse("rl", [*flags, "--data.image_key", "image"]))
