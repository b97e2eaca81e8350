"""The builder pipeline: plan, sample, grade, aggregate, filter, save; resume, shard."""
