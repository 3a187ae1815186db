"""The text of a Triton `config.pbtxt` for a sequence-batched onnxruntime
model whose state Triton keeps (`export.triton`, `export.triton_cached`)."""


def config_text(model_name, max_batch_size, outputs, states, max_candidate_sequences,
                max_queue_delay_microseconds, max_sequence_idle_microseconds):
    """A `config.pbtxt` of a sequence-batched onnxruntime model whose one
    input is `token_ids` `[-1]`; `outputs`: `(name, type, dims)`; `states`:
    `state_text`s."""
    lines = [
        f'name: "{model_name}"',
        'backend: "onnxruntime"',
        f"max_batch_size: {int(max_batch_size)}",
        "input [",
        tensor_text("token_ids", "TYPE_INT32", [-1]),
        "]",
        "output [",
        ",\n".join(tensor_text(*o) for o in outputs),
        "]",
        "sequence_batching {",
        f"  max_sequence_idle_microseconds: {int(max_sequence_idle_microseconds)}",
        "  oldest {",
        f"    max_candidate_sequences: {int(max_candidate_sequences)}",
        f"    max_queue_delay_microseconds: {int(max_queue_delay_microseconds)}",
        "  }",
        "  state [",
        ",\n".join(states),
        "  ]",
        "}",
    ]
    return "\n".join(lines) + "\n"


def _dims(dims):
    return "[ " + ", ".join(str(int(d)) for d in dims) + " ]"


def tensor_text(name, data_type, dims):
    """One entry of `input [...]` or `output [...]`."""
    return f'  {{\n    name: "{name}"\n    data_type: {data_type}\n    dims: {_dims(dims)}\n  }}'


def state_text(input_name, output_name, data_type, dims, start, start_name):
    """One implicit state; `start`: its initial state's data line."""
    return "\n".join([
        "    {",
        f'      input_name: "{input_name}"',
        f'      output_name: "{output_name}"',
        f"      data_type: {data_type}",
        f"      dims: {_dims(dims)}",
        "      initial_state: {",
        f"        data_type: {data_type}",
        f"        dims: {_dims(dims)}",
        f"        {start}",
        f'        name: "{start_name}"',
        "      }",
        "    }"])
