"""compat.attention_implementation: every config a forward reads is switched and restored, as is its state."""

from types import SimpleNamespace

import pytest

from forcedweight.compat import attention_configs, attention_implementation


class _Config(SimpleNamespace):
    def __init__(self, impl, text=None):
        super().__init__(_attn_implementation=impl)
        self._text = text

    def get_text_config(self):
        return self._text if self._text is not None else self


def test_a_multimodal_model_switches_its_text_config_too_and_restores_both():
    text = _Config("eager")
    model = SimpleNamespace(config=_Config("sdpa", text))
    assert attention_configs(model) == [model.config, text]
    with pytest.raises(RuntimeError):
        with attention_implementation(model, "mine"):
            assert (model.config._attn_implementation, text._attn_implementation) == ("mine", "mine")
            raise RuntimeError("inside")
    assert (model.config._attn_implementation, text._attn_implementation) == ("sdpa", "eager")


def test_a_plain_model_has_one_config_and_none_leaves_it():
    model = SimpleNamespace(config=_Config("sdpa"))
    assert attention_configs(model) == [model.config]
    with attention_implementation(model, None):
        assert model.config._attn_implementation == "sdpa"
    with attention_implementation(model, "mine"):
        assert model.config._attn_implementation == "mine"
    assert model.config._attn_implementation == "sdpa"


def test_the_state_is_set_for_the_run_and_reset_even_on_error():
    import contextvars

    var = contextvars.ContextVar("forcedweight_test_state", default="outside")
    model = SimpleNamespace(config=_Config("sdpa"))
    with attention_implementation(model, "mine", (var, "inside")):
        assert (var.get(), model.config._attn_implementation) == ("inside", "mine")
        with attention_implementation(model, None, (var, None)):  # nested, no switch: the state alone
            assert var.get() is None and model.config._attn_implementation == "mine"
        assert var.get() == "inside"
    assert (var.get(), model.config._attn_implementation) == ("outside", "sdpa")
    with pytest.raises(RuntimeError):
        with attention_implementation(model, "mine", (var, "inside")):
            raise RuntimeError("inside")
    assert (var.get(), model.config._attn_implementation) == ("outside", "sdpa")
