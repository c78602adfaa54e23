"""The LM stack every LM command shares: its settings groups (`config`, torch-free) and the one builder of
env spec, policy backend, predictor, actor and engine (`build`)."""
