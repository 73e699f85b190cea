"""What the hardware does and would do: calibrated peaks and the live sampler (`device`), bytes and FLOPs
per pass and the cost models (`roofline`), recorded profiles and published measurements (`profiles`)."""
