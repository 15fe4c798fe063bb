# The two commands the README starts with.
.PHONY: demo test deps

demo: deps
	bash .ci/demo.sh

test:
	bash .ci/test.sh

deps:
	bash .ci/deps.sh
