# pat-jj/DeepRetrieval@001a563d76d6cde9b831443a077fb90d2b084d45 code/src/eval/baselines/answer_filtered_test.py
# lines 72-124, verbatim (indented as in the file): the knowledge-injection check, the paper's Figure 18 prompt
if True:
    def create_prompt(original_query, query, answer_candidates):
        if type(query) == list:
            query = query[0]
        # print(answer_candidates)
        return """You are a helpful assistant that checks the quality of query augmentation. As we use LLM to augment the query, we need to check if the augmented query can be derived from the original query.
Your task is to analyze if there are answer spans in the query that directly match the answer candidates and cannot be derived from the original query without using prior knowledge.

Instructions:
1. Check if any part of the augmented query exactly matches or paraphrases any answer candidate, if so, set "has_answer" to true.
2. If the augmented query cannot be derived from the original query without using prior knowledge, set "cannot_be_derived" to true.
3. If both "has_answer" and "cannot_be_derived" are true, remove those answer spans from the query, without changing other parts of the augmented query.
4. Return your analysis in a strict JSON format

IMPORTANT: 
You must respond with valid JSON wrapped in <answer> tags. The JSON must have this exact structure:
The content between <answer> and </answer> MUST be a valid JSON object:
- Use double quotes for strings
- Escape special characters with backslashes (e.g., \\" for quotes within strings)
- Follow standard JSON formatting rules

Example valid response:
For the following original query:
"How many people live in New York City in 2020?"

and the augmented query:
("population" OR "residents") AND "new york city" AND "2020" AND "8 million"

Answer candidates to check against:
["8.253 million", "8,253,213", "8.25M", "approximately 8.25 million"]

<answer>
{
    "has_answer": true,
    "cannot_be_derived": true,
    "answer_span_in_query": ["8 million"],
    "matched_answer_candidates": ["approximately 8.25 million", "8.25M"],
    "cleaned_query": "(\"population\" OR \"residents\") AND \"new york city\" AND \"2020\""
}
</answer>

Now, your turn:

Original query:
""" + original_query + """

Augmented query to analyze:
""" + query + """   

Answer candidates to check against:
""" + str(answer_candidates) + """

Your response:
"""
