"""int8 post-training quantization of the job's model, its calibration samples and the accuracy gate."""
